"""The search space: every combination of layout knobs for a model on N GPUs, with the rule each
rejected combination breaks.

Enumeration is a cartesian product built with numpy (no Python loop per layout), so a space of
hundreds of thousands of layouts costs a fraction of a second. Combinations that are not layouts
at all (tp·pp·dp ≠ N) are never generated; every other rule is a rejection with a reason, so the
planner can say how many layouts each rule removed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from frontier_llm.costmodel.layouts import LayoutTable, encode, fill_defaults
from frontier_llm.errors import UserError
from frontier_llm.specs.layout import (
    COMPONENTS,
    DType,
    Engine,
    Placement,
    PlacementKind,
    Recompute,
    Schedule,
    Sharding,
    zero_preset,
)
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.pipeline_split import min_chunk_layers
from frontier_llm.specs.system import SystemSpec

# Rejection reasons, by code (0 = valid). The planner appends "does not fit in memory".
# In the order Layout checks them, so both name the same first broken rule.
REASONS = (
    "",
    "global_batch not divisible by micro_batch x dp",
    "interleaved needs micro-batches to be a multiple of pp",
    "partial sharding group does not divide dp",
    "heads not divisible by tp",
    "kv_heads and tp do not divide one another",
    "ffn_hidden not divisible by tp",
    "a pipeline chunk without layers",
    "seq_len not divisible by tp (sequence parallel)",
    "does not fit in memory",
)
OOM = REASONS.index("does not fit in memory")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class SearchSpace:
    """Candidate values for each knob; ``None`` means the planner's default list."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    micro_batch: tuple[int, ...] | None = None
    schedule: tuple[str, ...] = Schedule.words()
    # For the interleaved schedule; None: every v > 1 that divides the layers of a stage.
    virtual_stages: tuple[int, ...] | None = None
    recompute: tuple[str, ...] = Recompute.words()
    sequence_parallel: tuple[bool, ...] = (False, True)
    flash_attention: tuple[bool, ...] = (True,)
    dtype: str = "bf16"
    sharding: tuple[Sharding, ...] | None = None  # None: ZeRO-0..3 and node-local partial ones
    max_tp: int = 64
    max_micro_batch: int = 16


def _shardings(system: SystemSpec, tp: int, dp: int) -> list[Sharding]:
    """ZeRO-0..3 plus AMSP's partial placements over the DP ranks that share a node."""
    out = [zero_preset(s) for s in range(4)]
    k = system.gpus_per_node // tp if tp <= system.gpus_per_node else 1
    if 1 < k < dp and dp % k == 0:
        levels = [Placement(PlacementKind.REPLICATE), Placement(PlacementKind.PARTIAL, k),
                  Placement(PlacementKind.FULL)]
        for p, g, o in itertools.combinations_with_replacement(range(3), 3):
            s = Sharding(levels[p], levels[g], levels[o])
            if 1 in (p, g, o) and s not in out:
                out.append(s)
    return out


def enumerate_layouts(model: ModelSpec, system: SystemSpec, gpus: int, global_batch: int,
                      space: SearchSpace | None = None) -> tuple[LayoutTable, np.ndarray]:
    """Every candidate layout as a table, and the reason code of each (0 = valid)."""
    space = space or SearchSpace()
    if gpus < 1:
        raise UserError(f"--gpus must be at least 1 (got {gpus})")
    if global_batch < 1:
        raise UserError(f"global batch must be at least 1 (got {global_batch})")
    tps = space.tp or tuple(d for d in divisors(gpus) if d <= space.max_tp)
    bad_tp = [t for t in tps if gpus % t]
    if bad_tp:
        raise UserError(f"tp {bad_tp[0]} does not divide the {gpus} GPUs")
    micro = space.micro_batch or tuple(
        b for b in (1, 2, 4, 8, 16, 32) if b <= space.max_micro_batch)
    blocks = []
    for tp in tps:
        pps = space.pp or tuple(d for d in divisors(gpus // tp) if d <= model.layers)
        for pp in pps:
            if (gpus // tp) % pp:
                continue
            dp = gpus // (tp * pp)
            shard = space.sharding or tuple(_shardings(system, tp, dp))
            block = _product(tp, pp, dp, micro, _schedules(model, pp, space), space, shard,
                             global_batch)
            if block is not None:
                blocks.append(block)
    if not blocks:
        raise UserError(f"no tp x pp x dp layout of {gpus} GPUs matches the requested degrees")
    cols = {k: np.concatenate([b[k] for b in blocks]) for k in blocks[0]}
    table = LayoutTable(**cols)
    return table, _reasons(model, table)


def _schedules(model: ModelSpec, pp: int, space: SearchSpace) -> list[tuple[int, int]]:
    """(schedule code, virtual stages) pairs for a pipeline of ``pp`` stages."""
    out = []
    for name in map(Schedule, space.schedule):
        if name != Schedule.INTERLEAVED:
            out.append((name.code, 1))
        elif pp > 1:  # interleaving without a pipeline is not a layout
            per_stage = model.layers // pp if model.layers % pp == 0 else 0
            vs = space.virtual_stages or tuple(v for v in divisors(per_stage) if v > 1)
            out += [(name.code, v) for v in vs if v > 1]
    return out


def _product(tp, pp, dp, micro, sched_v, space, shardings, global_batch) -> dict | None:
    rec = [Recompute(r).code for r in space.recompute]
    # Sequence parallelism without TP and interleaving without a pipeline are not layouts.
    sp = [s for s in space.sequence_parallel if tp > 1 or not s]
    if not sched_v:
        return None
    shard_rows = [list(encode("sharding", s).values()) for s in shardings]
    grids = np.meshgrid(
        np.arange(len(micro)), np.arange(len(sched_v)), np.arange(len(rec)),
        np.arange(len(sp)), np.arange(len(space.flash_attention)), np.arange(len(shard_rows)),
        indexing="ij",
    )
    i_mb, i_sv, i_rc, i_sp, i_fa, i_sh = (g.ravel() for g in grids)
    n = len(i_mb)
    sv = np.array(sched_v)
    sh = np.array(shard_rows)
    cols = {
        "tp": np.full(n, tp), "pp": np.full(n, pp), "dp": np.full(n, dp),
        "micro_batch": np.array(micro)[i_mb], "global_batch": np.full(n, global_batch),
        "schedule": sv[i_sv, 0], "virtual_stages": sv[i_sv, 1],
        "sequence_parallel": np.array(sp, dtype=bool)[i_sp],
        "recompute": np.array(rec)[i_rc],
        "flash_attention": np.array(space.flash_attention, dtype=bool)[i_fa],
        "dtype": np.full(n, DType(space.dtype).code),
    }
    for j, col in enumerate(encode("sharding", shardings[0])):
        cols[col] = sh[i_sh, j]
    # Knobs the space does not enumerate keep the Layout's default.
    return fill_defaults(cols, n)


def _empty_chunks(model: ModelSpec, t: LayoutTable) -> np.ndarray:
    """Layouts whose engine's split (specs/pipeline_split.py) leaves a chunk with no layer;
    computed once per distinct (pp, virtual_stages, engine)."""
    keys = np.stack([t.pp, t.virtual_stages, t.engine], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    empty = np.array([min_chunk_layers(model, int(p), int(v), Engine.from_code(e)) < 1
                      for p, v, e in uniq], dtype=bool)
    return empty[inverse.ravel()]


def _reasons(model: ModelSpec, t: LayoutTable) -> np.ndarray:
    """The first rule each layout breaks (index into REASONS), 0 when it breaks none."""
    mb_dp = t.micro_batch * t.dp
    m = t.global_batch // mb_dp
    partial = np.zeros(len(t), dtype=bool)
    for comp in COMPONENTS:
        kind = getattr(t, f"{comp}_kind")
        group = np.maximum(getattr(t, f"{comp}_group"), 1)
        partial |= (kind == PlacementKind.PARTIAL.code) & (t.dp % group != 0)
    rules = [
        t.global_batch % mb_dp != 0,
        (t.schedule == Schedule.INTERLEAVED.code) & (m % t.pp != 0),
        partial,
        model.heads % t.tp != 0,
        (model.kv_heads % t.tp != 0) & (t.tp % model.kv_heads != 0),
        model.ffn_hidden % t.tp != 0,
        _empty_chunks(model, t),
        t.sequence_parallel & (model.seq_len % t.tp != 0),
    ]
    reason = np.zeros(len(t), dtype=np.int8)
    for code in range(len(rules), 0, -1):  # the first rule broken wins
        reason[rules[code - 1]] = code
    return reason
