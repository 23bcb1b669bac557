"""Both engines of ``flm bench`` run every layout the planner proposes for them: for the small
catalog models and GPT-3 125M (tied embeddings, as every GPT-3 model) on the CPU system
(``cpu-local``), 1 to 8 ranks, each bench engine, the default and a small global batch, bf16 and
fp32, every layout the planner ranks passes the bench's pre-launch check
(``bench/engines.check``, what ``flm bench`` runs before any process starts). Where an engine
truly cannot run a layout the rule belongs in ``specs/engine_rules.py`` (so the planner never
proposes it), not in the bench alone."""

from __future__ import annotations

import pytest

from frontier_llm.bench.engines import BENCH_ENGINES, check
from frontier_llm.catalog import load_model, load_system
from frontier_llm.planner import SearchSpace, plan

# The small catalog models, and the smallest GPT-3 (tied embeddings, as every GPT-3 model).
MODELS = ("tiny-gpt", "tiny-llama", "tiny-gpt-8l", "small-gpt", "gpt3-125m")


@pytest.mark.parametrize("engine", [str(e) for e in BENCH_ENGINES])
def test_every_proposed_layout_passes_the_bench_check(engine):
    system = load_system("cpu-local")
    checked, pipelines_with_tp, tied_pipelines = 0, 0, 0
    refused = []
    for name in MODELS:
        model = load_model(name)
        for world in range(1, 9):
            for global_batch in (None, world):  # the planner's default and one per rank
                for dtype in ("bf16", "fp32"):
                    p = plan(model, system, world, global_batch,
                             SearchSpace(engine=(engine,), dtype=dtype))
                    for i in p.ranked_indices():
                        layout = p.layout(i)
                        try:
                            check(model, layout, world)
                        except Exception as err:  # collected, reported below
                            refused.append((name, world, layout, str(err)))
                        checked += 1
                        pipelines_with_tp += layout.pp > 1 and layout.tp > 1
                        tied_pipelines += layout.pp > 1 and model.tied_embeddings
    assert not refused, (len(refused), refused[:3])
    assert checked > 5000 and pipelines_with_tp > 100 and tied_pipelines > 100, (
        checked, pipelines_with_tp, tied_pipelines)
