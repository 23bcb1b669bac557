"""How each engine splits the transformer layers over pipeline chunks, even or not.

:func:`stage_layers` gives the layers of every model chunk in pipeline order (chunk ``c·pp + r``
is virtual stage ``c`` of pipeline rank ``r``; chunk 0 holds the embeddings, the last chunk the
final norm, the output head and the loss). The cost model (the slowest chunk sets the pace, the
fullest the memory), ``Layout.check_model`` (no chunk may be empty), the planner and ``flm bench``
read it. Each engine's rule is the one its own code applies (``pipeline_split`` in
``specs/engine_rules.py`` names it):

- ``manual`` (native, ``torch.distributed.pipelining``): the user builds each stage's module, so
  the split is ours. Even when ``pp × v`` divides the layers (what ``flm bench`` always did);
  otherwise TorchTitan's ``generate_llm_fqn_per_model_part`` (``torchtitan/distributed/
  pipeline_parallel.py``): the embedding and the output head each weigh one layer, the
  ``layers + 2`` units are spread evenly with the remainder on the first chunks, and the first
  and last chunks give up their one unit to the embedding and the head. Where that would leave an
  end chunk empty, the layers are spread evenly instead (fewer layers than chunks: some get
  none), the extra ones on the middle chunks first.
- ``first_last`` (Megatron-LM): even when divisible. Otherwise what
  ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers`` allow
  (``megatron/core/transformer/transformer_block.py`` ``get_num_layers_to_build``: the first and
  the last stage take the given counts, the middle stages split the rest evenly, and the
  interleaved schedule is refused with an uneven split): every middle stage gets
  ``ceil(layers / pp)``, and the first and last stage share what is left, the first the larger
  half, since the last also holds the head and the loss. Interleaving with an uneven split is an
  error here too (``engine_rules`` refuses it).
- ``parameters`` (DeepSpeed ``PipelineModule(partition_method="parameters")``, its default;
  ``deepspeed/runtime/pipe/module.py`` ``_partition_layers`` with ``ds_utils.partition_balanced``
  over ``_count_layer_params``): contiguous parts balanced by parameter count, the embedding
  counted on the first stage and the output head (a ``TiedLayerSpec`` of the embedding when tied,
  still counted) on the last. We take the split with the smallest heaviest part; among those the
  surplus layers leave the heaviest parts first (on a tie the one with more layers, then the later
  one). DeepSpeed applies
  it whether or not the layers divide evenly, and so do we. DeepSpeed's pipeline engine has no
  interleaving, so ``virtual_stages`` is 1.

Given end stages (the layout's ``first_stage_layers`` / ``last_stage_layers``, Megatron-LM's
``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``) replace the
engine's rule with Megatron-Core's (``TransformerConfig.__post_init__`` "Uneven PP" and
``get_num_layers_to_build``, megatron/core/transformer/transformer_config.py and
transformer_block.py at 309ffca, core_v0.15.3; the same at d98e8a6): each given count is at
least 1 and, interleaved, a multiple of ``virtual_stages``; the layers left divide evenly over
the stages left (none left: no layers left), and so does each middle stage's share over
``virtual_stages``. Every chunk of a stage holds ``stage layers / virtual_stages``, so uneven
stages compose with interleaving under these rules (61 layers over pp 8 x vp 2 does not: every
stage even, 61 odd). DeepSpeed's ``PipelineModule`` takes no per-stage counts, so its engine
refuses them (``specs/engine_rules.py``).
"""

from __future__ import annotations

import heapq
import math
from functools import lru_cache

from frontier_llm.errors import SpecError
from frontier_llm.specs.engine_rules import rules_for
from frontier_llm.specs.model import ModelSpec


def stage_layers(layers: int, pp: int, virtual_stages: int, engine: str,
                 model: ModelSpec | None = None, first: int = 0, last: int = 0
                 ) -> tuple[int, ...]:
    """Transformer layers of each of the ``pp × virtual_stages`` model chunks, in pipeline order.

    ``engine`` is an ``Engine`` (or its word). ``model`` gives DeepSpeed's parameter weights (the
    embedding and the head against one layer); without it both ends weigh one layer. A chunk may
    come out with 0 layers when there are too few; ``Layout.check_model`` refuses that.
    ``first`` / ``last``: the layers of the first / last stage as given (0: not given), split
    Megatron's way (:func:`given_ends`; SpecError names the rule broken).
    """
    rule = rules_for(engine).pipeline_split
    if layers < 1 or pp < 1 or virtual_stages < 1:
        raise SpecError(f"layers, pp and virtual_stages must be at least 1 "
                        f"(got {layers}, {pp}, {virtual_stages})", "pp")
    if first or last:
        if rule == "parameters":
            raise SpecError(f"engine {engine} balances stages by parameters (DeepSpeed's "
                            "PipelineModule takes no per-stage layer counts): leave "
                            "first_stage_layers and last_stage_layers unset", "first_stage_layers")
        return given_ends(layers, pp, virtual_stages, first, last)
    if rule == "parameters":
        emb, head = _end_weights(model)
        return _balanced(layers, pp * virtual_stages, emb, head)
    chunks = pp * virtual_stages
    if layers % chunks == 0:
        return (layers // chunks,) * chunks
    if rule == "first_last":
        if virtual_stages > 1:
            raise SpecError(f"engine megatron splits layers unevenly only without interleaving "
                            f"(layers {layers}, pp x virtual_stages {pp} x {virtual_stages})",
                            "engine")
        return _first_last(layers, pp)
    return _manual(layers, chunks)


def min_chunk_layers(model: ModelSpec, pp: int, virtual_stages: int, engine: str,
                     first: int = 0, last: int = 0) -> int:
    """The fewest layers any chunk gets (0: the layout is refused). Where the engine has no
    uneven split of its own with interleaving (Megatron) the engine rule refuses the layout
    instead, so this reports the even floor split there. Given end stages (``first`` /
    ``last``) are checked by :func:`given_ends`, which refuses an empty chunk itself."""
    chunks = pp * virtual_stages
    if (virtual_stages > 1 and not rules_for(engine).uneven_interleaved
            and not (first or last)):
        return model.layers // chunks
    return min(stage_layers(model.layers, pp, virtual_stages, engine, model, first, last))


def given_ends(layers: int, pp: int, virtual_stages: int, first: int, last: int
               ) -> tuple[int, ...]:
    """Chunks in pipeline order when the first and/or last stage's layers are given (0: not
    given), by Megatron-Core's rules (module docstring): SpecError, naming the field, for each
    rule Megatron raises on."""
    v = virtual_stages
    if pp < 2:
        raise SpecError(f"first_stage_layers / last_stage_layers need pp >= 2 (got pp {pp})",
                        "first_stage_layers" if first else "last_stage_layers")
    rest, stages = layers, pp
    for name, given in (("first_stage_layers", first), ("last_stage_layers", last)):
        if not given:
            continue
        if given < 0:
            raise SpecError(f"{name} must be at least 1 (got {given})", name)
        if given % v:
            raise SpecError(f"{name} ({given}) must be divisible by virtual_stages ({v}): "
                            "each of the stage's chunks holds the same number of layers "
                            "(Megatron-Core)", name)
        rest, stages = rest - given, stages - 1
    field = "last_stage_layers" if last else "first_stage_layers"
    if rest < 0 or bool(rest) != bool(stages):
        raise SpecError(f"first_stage_layers ({first or '-'}) and last_stage_layers "
                        f"({last or '-'}) leave {rest} layers of {layers} for {stages} middle "
                        f"stages of pp {pp}: each middle stage needs at least one layer, and "
                        "no layer may be left without a stage", field)
    if stages and rest % stages:
        raise SpecError(f"the {rest} layers left after first_stage_layers ({first or '-'}) and "
                        f"last_stage_layers ({last or '-'}) do not divide evenly over the "
                        f"{stages} middle stages (Megatron-Core: \"number of layers at middle "
                        "stage must be divisible by the middle pipeline model parallel size\")",
                        field)
    middle = rest // stages if stages else 0
    if stages and middle % v:
        raise SpecError(f"each middle stage's {middle} layers are not divisible by "
                        f"virtual_stages ({v}) (Megatron-Core: the layers of a middle pipeline "
                        "rank must divide by the virtual pipeline degree)", field)
    ranks = [middle] * pp
    if first:
        ranks[0] = first
    if last:
        ranks[-1] = last
    return tuple(ranks[r] // v for _ in range(v) for r in range(pp))


def _end_weights(model: ModelSpec | None) -> tuple[float, float]:
    """Parameters of the embedding and of the head (norm + output projection, counted even when
    tied, as DeepSpeed counts a TiedLayerSpec) in units of one transformer layer's."""
    if model is None:
        return 1.0, 1.0
    per = model.layer_params()
    norm = 2 * model.hidden if model.norm == "layernorm" else model.hidden
    return model.embedding_params() / per, (norm + model.vocab * model.hidden) / per


@lru_cache(maxsize=4096)
def _manual(layers: int, chunks: int) -> tuple[int, ...]:
    units, extra = divmod(layers + 2, chunks)
    out = [units + (1 if c < extra else 0) for c in range(chunks)]
    out[0] -= 1
    out[-1] -= 1
    if min(out) >= 1:
        return tuple(out)
    # Too few layers to give the ends a unit each: spread them evenly, the extra ones on the
    # middle chunks first, then the first chunk (the last one also holds the head and the loss).
    per, extra = divmod(layers, chunks)
    order = [*range(1, chunks - 1), 0, chunks - 1]
    out = [per] * chunks
    for c in order[:extra]:
        out[c] += 1
    return tuple(out)


@lru_cache(maxsize=4096)
def _first_last(layers: int, pp: int) -> tuple[int, ...]:
    if pp == 1:
        return (layers,)
    middle = -(-layers // pp)
    rest = layers - (pp - 2) * middle
    if rest < 2:  # too few left for both ends: fewer in the middle, the ends get the rest
        middle = layers // pp
        rest = layers - (pp - 2) * middle
    last = rest // 2
    return (rest - last,) + (middle,) * (pp - 2) + (last,)


@lru_cache(maxsize=4096)
def _balanced(layers: int, chunks: int, emb: float, head: float) -> tuple[int, ...]:
    if chunks == 1:
        return (layers,)
    ends = [emb] + [0.0] * (chunks - 2) + [head]

    def capacity(bound: float) -> list[int] | None:
        # Whole layers (weight 1) that fit under the bound beside each part's end weight.
        caps = [math.floor(bound - e + 1e-9) if bound + 1e-9 >= e else -1 for e in ends]
        return None if min(caps) < 0 or sum(caps) < layers else caps

    # The smallest heaviest part weighs k layers plus one part's end weight (0, emb or head) for
    # some whole k; feasibility grows with the bound, so a binary search over k finds, for each
    # end weight, the least feasible k (log(layers) probes, however many layers).
    def least(offset: float) -> float:
        lo, hi = 0, layers + math.ceil(max(emb, head))
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if capacity(mid + offset) is not None else (mid + 1, hi)
        return lo + offset

    caps = capacity(min(least(e) for e in {0.0, emb, head}))
    assert caps is not None
    # Take the surplus from the heaviest part (ties: more layers, then the later part), one
    # layer at a time; a heap keeps that O(surplus log chunks).
    heap = [(-(c + e), -c, -i) for i, (c, e) in enumerate(zip(caps, ends, strict=True)) if c]
    heapq.heapify(heap)
    for _ in range(sum(caps) - layers):
        _, _, i = heapq.heappop(heap)
        caps[-i] -= 1
        if caps[-i]:
            heapq.heappush(heap, (-(caps[-i] + ends[-i]), -caps[-i], i))
    return tuple(caps)
