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


# Given end stages: Megatron-Core's uneven rules (TransformerConfig.__post_init__ "Uneven PP",
# get_num_layers_to_build; megatron/core/transformer/transformer_config.py and
# transformer_block.py at 309ffca). (layers, pp, v, first, last) -> chunks in pipeline order.
GIVEN = [
    (61, 16, 1, 4, 1, (4,) + (4,) * 14 + (1,)),  # DeepSeek-V3 over pp 16
    (61, 16, 1, 3, 2, (3,) + (4,) * 14 + (2,)),
    (61, 8, 1, 5, 0, (5,) + (8,) * 7),  # only the first given: the last is a middle stage
    (61, 8, 1, 0, 5, (8,) * 7 + (5,)),
    (60, 8, 2, 4, 8, ((2,) + (4,) * 6 + (4,)) * 2),  # interleaved: chunk c·pp + r
    (94, 8, 1, 10, 0, (10,) + (12,) * 7),  # Qwen3-235B-A22B's 94 layers over pp 8
    (7, 2, 1, 4, 3, (4, 3)),  # no middle stage
    (7, 2, 1, 4, 0, (4, 3)),
]


@pytest.mark.parametrize(("layers", "pp", "v", "first", "last", "split"), GIVEN)
@pytest.mark.parametrize("engine", ["megatron", "native"])
def test_given_ends_split_megatrons_way(layers, pp, v, first, last, split, engine):
    got = stage_layers(layers, pp, v, engine, None, first, last)
    assert got == split and sum(got) == layers


@pytest.mark.parametrize(("layers", "pp", "v", "first", "last", "words"), [
    (61, 16, 1, 4, 2, "do not divide evenly over the 14 middle stages"),
    (61, 8, 2, 5, 0, "first_stage_layers (5) must be divisible by virtual_stages (2)"),
    (61, 8, 2, 6, 6, "do not divide evenly"),  # 49 over 6: and 61 is odd, every stage even
    (60, 8, 2, 6, 12, "each middle stage's 7 layers are not divisible by virtual_stages"),
    (8, 2, 1, 4, 3, "leave 1 layers of 8 for 0 middle stages"),
    (8, 4, 1, 4, 4, "leave 0 layers of 8 for 2 middle stages"),
    (8, 1, 1, 4, 0, "need pp >= 2"),
])
def test_given_ends_refused_as_megatron_refuses(layers, pp, v, first, last, words):
    with pytest.raises(SpecError, match=words.replace("(", r"\(").replace(")", r"\)")):
        stage_layers(layers, pp, v, "megatron", None, first, last)


def test_given_ends_refused_by_deepspeed():
    """DeepSpeed's PipelineModule takes no per-stage counts: the layout and the split say so."""
    from frontier_llm.specs.layout import Layout

    with pytest.raises(SpecError, match="no per-stage layer counts"):
        stage_layers(61, 16, 1, "deepspeed", None, 4, 1)
    with pytest.raises(SpecError, match="engine deepspeed runs first_stage_layers = 0 only"):
        Layout(pp=16, dp=1, engine="deepspeed", first_stage_layers=4)


def test_given_ends_let_megatron_interleave_an_uneven_model():
    """Megatron refuses its own uneven split interleaved, but not given ends that keep each
    chunk whole: 94 layers over pp 8 x vp 2 with 10 + 6 x 12 + 12 (Qwen3-235B-A22B's depth)."""
    from frontier_llm.specs.layout import Layout

    model = load_model("qwen3-235b-a22b")
    own = Layout(pp=8, dp=1, schedule="interleaved", virtual_stages=2, global_batch=8,
                 engine="megatron")
    with pytest.raises(SpecError, match="unevenly only without interleaving"):
        own.check_model(model)
    given = Layout(pp=8, dp=1, schedule="interleaved", virtual_stages=2, global_batch=8,
                   engine="megatron",
                   first_stage_layers=10, last_stage_layers=12)
    chunks = given.stage_layers(model)
    assert [sum(chunks[r::8]) for r in range(8)] == [10] + [12] * 7
    assert chunks[:8] == (5,) + (6,) * 7


def test_61_layers_never_interleave_over_pp8_vp2():
    """Every stage of pp 8 x vp 2 holds an even count, so 61 layers fit no given ends: the
    refusal names Megatron's rule instead of a silent split."""
    for first in range(2, 20, 2):
        for last in range(2, 20, 2):
            with pytest.raises(SpecError):
                stage_layers(61, 8, 2, "megatron", None, first, last)
