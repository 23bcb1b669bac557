"""Uneven pipeline stages: each engine's split (specs/pipeline_split.py)."""

from __future__ import annotations

import itertools

import pytest

from frontier_llm.catalog import load_model
from frontier_llm.errors import SpecError
from frontier_llm.specs.pipeline_split import _balanced, stage_layers

# (layers, pp, virtual_stages, engine) -> split, worked out by hand from each engine's rule.
CASES = [
    # The Megatron-DeepSpeed run: 70 layers on 12 stages.
    (70, 12, 1, "megatron", (5,) + (6,) * 10 + (5,)),
    (70, 12, 1, "native", (5,) + (6,) * 10 + (5,)),
    (80, 12, 1, "megatron", (5,) + (7,) * 10 + (5,)),  # middle ceil(80/12)=7, ends share 10
    (9, 4, 1, "megatron", (2, 3, 3, 1)),  # first gets the larger half
    (5, 4, 1, "megatron", (2, 1, 1, 1)),  # too few for ceil in the middle
    (7, 2, 1, "megatron", (4, 3)),
    (9, 4, 1, "native", (2, 3, 3, 1)),  # TorchTitan: 11 units, 3,3,3,2 less the two ends
    (80, 64, 1, "native", (1,) + (2,) * 16 + (1,) * 47),  # ends would be empty: even spread
    (48, 5, 1, "native", (9, 10, 10, 10, 9)),
    (24, 4, 2, "native", (3,) * 8),  # even stays even
    (24, 4, 1, "megatron", (6,) * 4),
    (24, 4, 1, "deepspeed", (6,) * 4),  # ends weigh one layer each without a model
    (4, 5, 1, "native", (1, 1, 1, 1, 0)),  # fewer layers than chunks: refused by check_model
]


@pytest.mark.parametrize(("layers", "pp", "v", "engine", "split"), CASES)
def test_split_per_engine(layers, pp, v, engine, split):
    assert stage_layers(layers, pp, v, engine) == split


@pytest.mark.parametrize("engine", ["native", "megatron", "deepspeed"])
@pytest.mark.parametrize(("layers", "pp", "v"), [(n, p, v) for n in (4, 7, 24, 70, 126)
                                                 for p in (1, 2, 3, 5, 8, 12) for v in (1, 2)])
def test_split_covers_every_layer_once(engine, layers, pp, v):
    if engine != "native" and v > 1:
        v = 1  # interleaving with an uneven split is Megatron's refusal; DeepSpeed has none
    split = stage_layers(layers, pp, v, engine)
    assert len(split) == pp * v and sum(split) == layers and min(split) >= 0
    if engine != "deepspeed" and layers % (pp * v) == 0:
        assert set(split) == {layers // (pp * v)}
    if engine == "megatron" and pp > 2 and layers >= 2 * pp:
        # Megatron's flags: the middle stages equal, the ends no fuller than them.
        assert len(set(split[1:-1])) == 1 and max(split[0], split[-1]) <= split[1]


def test_megatron_refuses_uneven_interleaving():
    with pytest.raises(SpecError, match="megatron splits layers unevenly only without"):
        stage_layers(70, 6, 2, "megatron")


@pytest.mark.parametrize(("layers", "chunks", "emb", "head"),
                         [(n, c, e, h) for n in (3, 6, 9) for c in (2, 3, 4)
                          for e, h in ((0.3, 0.3), (1.0, 1.0), (2.5, 0.4), (4.0, 4.0))])
def test_deepspeed_parameters_split_has_the_smallest_heaviest_stage(layers, chunks, emb, head):
    """Brute force over every contiguous split: none has a lighter heaviest stage."""
    def heaviest(split):
        weights = [n + (emb if i == 0 else 0) + (head if i == len(split) - 1 else 0)
                   for i, n in enumerate(split)]
        return max(weights)

    best = min(heaviest(s) for s in itertools.product(range(layers + 1), repeat=chunks)
               if sum(s) == layers)
    split = _balanced(layers, chunks, emb, head)
    assert sum(split) == layers and heaviest(split) == pytest.approx(best)


def test_deepspeed_counts_the_embedding_and_head_parameters():
    model = load_model("llama3-70b")  # 128K vocabulary: embedding ≈ 1.2 layers, head too
    split = stage_layers(model.layers, 4, 1, "deepspeed", model)
    assert sum(split) == 80 and split[0] < split[1] and split[-1] < split[2]
