"""The training engine in the planner: each engine's rules refuse what the engine refuses, the
planner's vectorised reasons agree with ``Layout`` (+ ``check_model``) row by row, and no planned
layout is one its engine rejects."""

from __future__ import annotations

import numpy as np
import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.errors import SpecError
from frontier_llm.planner import REASONS, SearchSpace, plan
from frontier_llm.planner.space import ENGINE_REASON, NODE_REASONS, OOM
from frontier_llm.specs.engine_rules import ONLY_KNOBS, RULES
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.space import NOT_SEARCHED

ENGINES = ("native", "megatron", "deepspeed")

# engine, layout knobs, model (None: the layout alone), the refusal (None: accepted).
RULE_TABLE = [
    ("megatron", dict(pp=2, global_batch=2, schedule="gpipe"), None, "has no 'gpipe' pipeline"),
    ("megatron", dict(pp=2, global_batch=2, schedule="1f1b"), None, None),
    ("megatron", dict(dp=2, global_batch=2, zero=2), None, "does not run sharding zero2"),
    ("megatron", dict(dp=2, global_batch=2, zero=1), None, None),
    ("megatron", dict(pp=5, global_batch=10, schedule="interleaved", virtual_stages=3),
     "gpt-22b", "splits layers unevenly only without interleaving"),
    ("megatron", dict(pp=5, global_batch=5), "gpt-22b", None),  # 48 on 5 stages: first/last
    ("megatron", dict(dtype="fp16"), None, None),
    ("deepspeed", dict(pp=2, global_batch=4, schedule="interleaved", virtual_stages=2), None,
     "has no 'interleaved' pipeline"),
    ("deepspeed", dict(pp=2, global_batch=2, schedule="gpipe"), None, "has no 'gpipe'"),
    ("deepspeed", dict(pp=2, dp=2, global_batch=4, zero=2), None,
     "does not compose sharding zero2 with pipeline"),
    ("deepspeed", dict(pp=2, dp=2, global_batch=4, zero=1), None, None),
    ("deepspeed", dict(dp=4, global_batch=4, zero=3), None, None),
    ("deepspeed", dict(dp=4, global_batch=4, sharding="p=partial:2,g=partial:2,o=partial:2"),
     None, "does not run sharding"),  # MiCS: gone from DeepSpeed 0.19
    ("deepspeed", dict(dp=4, global_batch=4, sharding="p=replicate,g=partial:2,o=full"), None,
     "does not run sharding"),
    ("deepspeed", dict(tp=2, sequence_parallel=True), None, "no sequence parallelism"),
    ("deepspeed", dict(pp=12, global_batch=12), "gpt3-125m", "leaves a chunk without layers"),
    ("native", dict(dtype="fp16"), None, "does not train in fp16"),
    ("native", dict(pp=2, global_batch=2, schedule="gpipe"), None, None),
    # FSDP2 expresses ZeRO-1/2/3 and HSDP, not AMSP's mixes (bench/mesh.py mesh_dims refuses
    # them too, so the planner must not propose them).
    ("native", dict(dp=4, global_batch=4, sharding="p=replicate,g=partial:2,o=full"), None,
     "does not run sharding"),
    ("native", dict(dp=4, global_batch=4, sharding="p=partial:2,g=full,o=full"), None,
     "does not run sharding"),
    ("native", dict(dp=4, global_batch=4, sharding="p=partial:2,g=partial:2,o=partial:2"), None,
     None),
    ("native", dict(pp=2, dp=4, global_batch=8, zero=3), None, None),
    ("native", dict(tp=16, global_batch=1), "llama3-8b", "shards whole K/V heads"),
    ("native", dict(tp=3), "gpt3-125m", "splits the vocabulary over tp"),  # 51200 % 3
    ("native", dict(pp=5, global_batch=10, schedule="interleaved", virtual_stages=3), "gpt-22b",
     None),  # uneven interleaved: 15 chunks of 3 or 4 layers
    ("native", dict(pp=5, global_batch=5), "tiny-gpt", "leaves a chunk without layers"),
    # Op-level selective checkpointing is PyTorch's (flm bench runs it: bench/checkpoint_policy).
    ("native", dict(recompute="selective-op"), None, None),
    ("megatron", dict(recompute="selective-op"), None, "has no 'selective-op' recomputation"),
    ("deepspeed", dict(recompute="selective-op"), None, "has no 'selective-op' recomputation"),
]


@pytest.mark.parametrize(("engine", "knobs", "model", "refusal"), RULE_TABLE)
def test_engine_rules_refuse_what_each_engine_refuses(engine, knobs, model, refusal):
    knobs = dict(knobs)
    if "zero" in knobs:
        knobs["sharding"] = knobs.pop("zero")

    def build():
        layout = Layout.from_dict({**knobs, "engine": engine})
        if model is not None:
            layout.check_model(load_model(model))

    if refusal is None:
        build()
    else:
        with pytest.raises(SpecError, match=refusal) as err:
            build()
        if "chunk" not in refusal:
            assert str(err.value).startswith(f"engine {engine}")


# Plans that, together, break every engine rule the planner knows.
SCENARIOS = [
    ("gpt-22b", "frontier", 64, 128, SearchSpace(engine=ENGINES)),
    ("gpt-22b", "frontier", 10, 30, SearchSpace(engine=ENGINES, tp=(1, 2), pp=(5,))),
    ("gpt-22b", "frontier", 8, 16, SearchSpace(engine=ENGINES, dtype="fp16")),
    ("llama3-8b", "dgx-h100", 32, 64, SearchSpace(engine=ENGINES, micro_batch=(1,))),
    ("gpt3-125m", "frontier", 48, 96, SearchSpace(engine=ENGINES, micro_batch=(1, 2))),
    # Every value of the knobs some engine runs at some values only (EngineRules.only).
    ("gpt3-125m", "frontier", 16, 32, SearchSpace(engine=ENGINES, micro_batch=(1,),
                                                  reshard_after_forward=(True, False))),
    # cp (issue 30): 2048 tokens split over 2·3 chunks fail; cp 2 with sequence parallelism
    # and tp 3 leaves 1024 tokens a rank, not divisible by 3; cp on DeepSpeed is refused.
    ("gpt3-125m", "frontier", 48, 96, SearchSpace(engine=ENGINES, micro_batch=(1,),
                                                  cp=(1, 2, 3), tp=(1, 3, 4), pp=(1, 2))),
    # ep (issue 41): 3 divides no dp of 32 GPUs, 16 not Mixtral's 8 experts, DeepSpeed runs ep
    # 1 only; a dense model listed with ep 2 is refused for it.
    ("mixtral-8x7b", "dgx-h100", 32, 64, SearchSpace(engine=ENGINES, micro_batch=(1,),
                                                     pp=(1, 2), ep=(1, 2, 3, 16))),
    ("gpt3-125m", "frontier", 16, 32, SearchSpace(engine=ENGINES, micro_batch=(1,), ep=(1, 2))),
    # fp8 (issue 52): DeepSpeed has no fp8 precision of its own.
    ("llama3-8b", "dgx-h100", 16, 32, SearchSpace(engine=ENGINES, micro_batch=(1,),
                                                  dtype="fp8")),
]


@pytest.fixture(scope="module")
def plans():
    return [plan(load_model(m), load_system(s), g, gb, space) for m, s, g, gb, space in SCENARIOS]


def _build(p, i):
    layout = p.layout(i)  # Layout.__post_init__: the layout's and its engine's own rules
    layout.check_model(p.model)
    return layout


def test_planner_never_proposes_a_layout_its_engine_rejects(plans):
    checked = 0
    for p in plans:
        rows = np.flatnonzero((p.reason == 0) | (p.reason == OOM))
        for i in rows[:: max(1, len(rows) // 400)]:
            layout = _build(p, int(i))  # raises if any rule refuses it
            assert not RULES[layout.engine].violations(layout, p.model)
            checked += 1
    assert checked > 1000


# Words of each engine rule's long message (EngineRules.broken).
RULE_WORDS = {"schedule": "pipeline schedule", "dtype": "does not train in",
              "sequence_parallel": "sequence parallelism", "sharding": "does not run sharding",
              "pipeline_sharding": "compose sharding", "uneven_interleaved": "unevenly",
              "whole_kv_heads": "whole K/V heads", "vocab_tp": "vocabulary",
              "recompute": "recomputation", "pipeline_microbatches": "micro-batch per stage",
              **{f"only_{k}": f"runs {k} =" for k in ONLY_KNOBS}}


def _keyword(reason: str) -> str:
    """What Layout's message for a planner reason contains."""
    for (engine, _rule), code in ENGINE_REASON.items():
        if REASONS[code] == reason:
            return f"engine {engine}"
    return {"global_batch not divisible by micro_batch x dp": "global_batch",
            "interleaved needs micro-batches to be a multiple of pp": "micro-batches",
            "partial sharding group does not divide dp x cp": "partial group",
            "heads not divisible by tp": "heads",
            "kv_heads and tp do not divide one another": "kv_heads",
            "ffn_hidden not divisible by tp": "ffn_hidden",
            "a pipeline chunk without layers": "without layers",
            "seq_len not divisible by 2 x cp": "2 x cp",
            "seq_len / cp not divisible by tp (sequence parallel)":
                "for sequence parallelism",
            "ep x expert-tp does not divide tp x dp x cp": "does not divide",
            "ep > 1 needs a Mixture-of-Experts model": "Mixture-of-Experts",
            "num_experts not divisible by ep": "num_experts",
            "expert_ffn_hidden not divisible by expert-tp": "expert_ffn_hidden"}[reason]


def test_each_rejection_is_the_first_rule_layout_names(plans):
    """Row by row (a sample of every reason), Layout refuses with the same first rule; every
    engine rule the planner knows is met at least once."""
    seen = set()
    for p in plans:
        for code in np.unique(p.reason):
            if code in (0, OOM) or REASONS[code] in NODE_REASONS:
                continue  # the node rules are the system's, not the Layout's (as memory)
            rows = np.flatnonzero(p.reason == code)
            for i in rows[:: max(1, len(rows) // 15)]:
                with pytest.raises(SpecError) as err:
                    _build(p, int(i))
                message = str(err.value)
                assert _keyword(REASONS[code]) in message, (REASONS[code], message)
                for (_, rule), c in ENGINE_REASON.items():
                    if c == code:  # Layout's first broken rule is this engine rule
                        assert RULE_WORDS[rule] in message, (REASONS[code], message)
            seen.add(int(code))
    # A rule on a knob the planner never enumerates (specs/space.py NOT_SEARCHED: the given
    # end stages) can not be met by a plan; Layout's side of it is tested on its own
    # (test_given_ends_refused_by_deepspeed).
    unsearched = {c for (_, rule), c in ENGINE_REASON.items()
                  if rule.startswith("only_") and rule[5:] in NOT_SEARCHED}
    missing = ({REASONS[c] for c in ENGINE_REASON.values() if c not in unsearched}
               - {REASONS[c] for c in seen})
    assert not missing


def test_uneven_pipelines_are_planned(plans):
    p = plans[1]  # 48 layers on 5 stages
    ranked = p.ranked(None, fits_only=False)
    engines = set(ranked["engine"].astype(str))
    assert {"native", "megatron", "deepspeed"} <= engines
    layout = p.layout(int(p.ranked_indices(1, fits_only=False)[0]))
    assert layout.pp == 5 and sum(layout.stage_layers(p.model)) == 48


def test_a_sweep_space_compares_engines(tmp_path):
    """space.engine is a list: one sweep holds each engine's valid layouts; a word that is no
    engine is refused with the file and line."""
    from frontier_llm.jobs.sweepspec import load_sweep

    text = ("name: engines\nsystem: frontier\nmodel: gpt-22b\ngpus: [8]\nglobal_batch: 16\n"
            "space:\n  tp: [8]\n  schedule: [gpipe, 1f1b]\n  pp: [1]\n  zero: [1, 3]\n"
            "  fits_only: false\n  engine: [native, megatron, deepspeed]\n")
    path = tmp_path / "s.yaml"
    path.write_text(text)
    sweep = load_sweep(path)
    engines = {(str(j.layout.engine), j.layout.sharding.describe()) for j in sweep.jobs}
    # Megatron has no ZeRO-3: the only pair missing.
    assert engines == {("native", "zero1"), ("native", "zero3"), ("megatron", "zero1"),
                       ("deepspeed", "zero1"), ("deepspeed", "zero3")}
    assert sweep.skipped["engine megatron runs only zero0, zero1"] == 2  # gpipe and 1f1b, pp 1
    path.write_text(text.replace("deepspeed]", "jax]"))
    with pytest.raises(SpecError, match="engine must be one of native, megatron, deepspeed"):
        load_sweep(path)


def test_explain_names_the_engine_rules_that_rejected_layouts(plans):
    from frontier_llm.planner.explain import explain

    text = explain(plans[0])
    assert "Rejected by an engine's own rules" in text
    lines = {line.split()[0]: line for line in text.splitlines()
             if line.startswith("  ") and line.split()[0] in ENGINES}
    assert "runs only zero0, zero1" in lines["megatron"]
    assert "has no sequence parallelism" in lines["deepspeed"]
    p = plans[0]
    megatron = sum(int(np.sum(p.reason == c)) for (e, _), c in ENGINE_REASON.items()
                   if e == "megatron")
    assert f"{megatron:,}" in lines["megatron"]
