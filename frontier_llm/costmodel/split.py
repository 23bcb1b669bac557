"""Layers per pipeline rank, as each layout's engine splits them (specs/pipeline_split.py).

The cost model needs, per layout, the layers a pipeline rank holds (all its chunks) and its
fullest chunk (interleaving keeps chunks in flight), for the ranks whose memory can be the peak
(rank 0, the fullest middle rank, rank p − 1: the fullest sets the peak) and the slowest (it sets
the pace). The split (``specs/pipeline_split.stage_layers``) depends only on (pp,
virtual_stages, engine, first_stage_layers, last_stage_layers), so it is computed once per
distinct combination in a table and gathered back per row.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from frontier_llm.costmodel.layouts import LayoutTable
from frontier_llm.errors import SpecError
from frontier_llm.specs.layout import Engine
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.pipeline_split import stage_layers


def chunk_layers(model: ModelSpec, pp: int, virtual_stages: int, engine: int,
                 first: int = 0, last: int = 0) -> tuple[int, ...]:
    """Layers of each of the pp × v chunks in pipeline order (chunk c·pp + r on rank r), as
    the engine (its code) splits them, or Megatron's way around given end stages (``first`` /
    ``last``, 0: not given). A split the engine refuses (Megatron: its own uneven split with
    interleaving; given ends that break Megatron's rules) is costed as the even floor split;
    the layout's rules reject it."""
    try:
        return stage_layers(model.layers, pp, virtual_stages, Engine.from_code(engine), model,
                            first, last)
    except SpecError:
        n = pp * virtual_stages
        return (model.layers // n,) * n


@lru_cache(maxsize=4096)
def _split(model: ModelSpec, pp: int, v: int, engine: int, first: int = 0, last: int = 0
           ) -> tuple[tuple[int, int], ...]:
    """(layers held, fullest chunk) of every rank."""
    chunks = chunk_layers(model, pp, v, engine, first, last)
    return tuple((sum(chunks[r::pp]), max(chunks[r::pp])) for r in range(pp))


@lru_cache(maxsize=4096)
def _moe_held(model: ModelSpec, pp: int, v: int, engine: int, first: int = 0, last: int = 0
              ) -> tuple[int, ...]:
    """MoE blocks each rank holds: the blocks of its chunks (chunk ``k`` holds the layers after
    chunks ``0..k-1``), so DeepSeek-V3's three dense blocks count on the first stage only."""
    chunks = chunk_layers(model, pp, v, engine, first, last)
    starts = np.concatenate([[0], np.cumsum(chunks)])
    moe_at = np.concatenate([[0], np.cumsum([model.moe_block(i) for i in range(model.layers)])])
    per_chunk = [int(moe_at[starts[k + 1]] - moe_at[starts[k]]) for k in range(len(chunks))]
    return tuple(sum(per_chunk[r::pp]) for r in range(pp))


def rank_moe_blocks(model: ModelSpec, t: LayoutTable, pp_rank) -> np.ndarray:
    """MoE blocks rank ``pp_rank`` (an int or a column) holds in every layout (0 for a dense
    model), by the same split as :func:`rank_layers`."""
    out = np.zeros(len(t), dtype=np.int64)
    if not model.is_moe or not len(t):
        return out
    r = np.broadcast_to(np.asarray(pp_rank), (len(t),)).astype(np.int64)
    ends, key, uniq, inverse, (vs, es) = _keys(t)
    if len(uniq):
        # Every rank's count per distinct split (a small table: splits x the widest pipeline),
        # then each row's rank picked from its split's row.
        table = np.zeros((len(uniq), int(t.pp.max())), dtype=np.int64)
        for j, k in enumerate(uniq):
            pp = int(k // es // vs)
            table[j, :pp] = _moe_held(model, pp, int(k // es % vs), int(k % es))
        out[~ends] = table[inverse[key[~ends]], r[~ends]]
    for i in np.flatnonzero(ends):
        out[i] = _moe_held(model, int(t.pp[i]), int(t.virtual_stages[i]), int(t.engine[i]),
                           int(t.first_stage_layers[i]), int(t.last_stage_layers[i]))[r[i]]
    return out


def _keys(t: LayoutTable):
    """(rows with given ends, each row's dense split key, the distinct keys of the other rows,
    key -> index into them, the key's radices). A dense key over the few (pp, v, engine) a table
    holds: a lookup table instead of a sort (np.unique) over every row. Given end stages are
    rare (the planner never searches them), so rows with them are looked up one at a time."""
    ends = (t.first_stage_layers > 0) | (t.last_stage_layers > 0)
    vs, es = int(t.virtual_stages.max()) + 1, int(t.engine.max()) + 1
    key = (t.pp.astype(np.int64) * vs + t.virtual_stages) * es + t.engine
    present = np.zeros(int(key.max()) + 1, dtype=bool)
    present[key[~ends]] = True
    return ends, key, np.flatnonzero(present), np.cumsum(present) - 1, (vs, es)


def _gather(model: ModelSpec, t: LayoutTable, fn) -> np.ndarray:
    """``fn(split, pp)`` (a tuple of ints) for each distinct (pp, v, engine, first, last) of
    ``t``, per row."""
    ends, key, uniq, inverse, (vs, es) = _keys(t)
    rows = [fn(_split(model, int(k // es // vs), int(k // es % vs), int(k % es)),
               int(k // es // vs)) for k in uniq]
    width = len(fn(_split(model, 1, 1, int(t.engine[0])), 1))
    out = np.zeros((len(t), width), dtype=np.int64)
    if len(uniq):
        out[~ends] = np.array(rows, dtype=np.int64).reshape(len(uniq), -1)[inverse[key[~ends]]]
    for i in np.flatnonzero(ends):
        pp = int(t.pp[i])
        out[i] = fn(_split(model, pp, int(t.virtual_stages[i]), int(t.engine[i]),
                           int(t.first_stage_layers[i]), int(t.last_stage_layers[i])), pp)
    return out


def _summary(split, pp) -> tuple[int, ...]:
    held = [h for h, _ in split]
    mid = max(range(1, pp - 1), key=lambda r: (held[r], -r), default=0)
    return (held[0], split[0][1], mid, held[mid], split[mid][1], held[-1], split[-1][1],
            max(held[:-1] or [0]))


def pipeline_ranks(model: ModelSpec, t: LayoutTable) -> dict[str, np.ndarray]:
    """Per layout: ``first``/``last`` (layers held by rank 0 / p − 1) with their fullest chunks
    ``chunk_first``/``chunk_last``; ``mid`` (the middle rank holding the most layers, the
    earliest on a tie: 0 when pp < 3), its ``mid_held`` and ``chunk_mid``; ``most_but_last``
    (the most held by any rank but the last, which also runs the head). Computed once per
    table and model (step time and memory both read it)."""
    memo = t.__dict__.get("_pipeline_ranks")
    if memo is not None and memo[0] is model:
        return memo[1]
    cols = _gather(model, t, _summary) if len(t) else np.zeros((0, 8), dtype=np.int64)
    names = ("first", "chunk_first", "mid", "mid_held", "chunk_mid", "last", "chunk_last",
             "most_but_last")
    out = {n: cols[:, i] for i, n in enumerate(names)}
    t.__dict__["_pipeline_ranks"] = (model, out)
    return out


def rank_layers(model: ModelSpec, t: LayoutTable, pp_rank) -> tuple[np.ndarray, np.ndarray]:
    """(layers held, fullest chunk) of rank ``pp_rank`` (an int or a column) in every layout.
    One Python step per row: for the scalar helpers, not the planner's tables."""
    r = np.broadcast_to(np.asarray(pp_rank), (len(t),))
    out = [_split(model, int(pp), int(v), int(e), int(f), int(la))[int(rr)]
           for pp, v, e, f, la, rr in zip(t.pp, t.virtual_stages, t.engine, t.first_stage_layers,
                                          t.last_stage_layers, r, strict=False)]
    arr = np.array(out, dtype=np.int64).reshape(len(t), 2)
    return arr[:, 0], arr[:, 1]
