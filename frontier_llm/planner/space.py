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
from frontier_llm.specs.engine_rules import LAYOUT_RULES, MODEL_RULES, RULES
from frontier_llm.specs.layout import (
    COMPONENTS,
    MAX_COUNT,
    MAX_GPUS,
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

# Rejection reasons, by code (0 = valid). In the order Layout checks them, so both name the
# same first broken rule: the layout's own rules, its engine's rules of the layout alone (one
# reason per engine and rule, naming the engine), the rules against the model, the engine's rules
# against the model, and last the cost model's "does not fit in memory".
_LAYOUT_REASONS = (
    "global_batch not divisible by micro_batch x dp",
    "interleaved needs micro-batches to be a multiple of pp",
    "partial sharding group does not divide dp",
)
_MODEL_REASONS = (
    "heads not divisible by tp",
    "kv_heads and tp do not divide one another",
    "ffn_hidden not divisible by tp",
    "a pipeline chunk without layers",
    "seq_len not divisible by tp (sequence parallel)",
)


def _engine_reasons(rules: tuple[str, ...]) -> tuple[tuple[Engine, str], ...]:
    return tuple((e, r) for e in Engine for r in rules if RULES[e].has_rule(r))


_ENGINE_LAYOUT = _engine_reasons(LAYOUT_RULES)
_ENGINE_MODEL = _engine_reasons(MODEL_RULES)
REASONS = (
    "",
    *_LAYOUT_REASONS,
    *(RULES[e].reason(r) for e, r in _ENGINE_LAYOUT),
    *_MODEL_REASONS,
    *(RULES[e].reason(r) for e, r in _ENGINE_MODEL),
    "does not fit in memory",
)
OOM = REASONS.index("does not fit in memory")
# (engine, rule) -> its code in REASONS.
ENGINE_REASON = {key: REASONS.index(RULES[key[0]].reason(key[1]))
                 for key in (*_ENGINE_LAYOUT, *_ENGINE_MODEL)}
_EMPTY_CHUNK = REASONS.index("a pipeline chunk without layers")


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order, by trial division up to sqrt(n) (n is at most
    MAX_GPUS, so this stays below a thousand steps)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


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
    engine: tuple[str, ...] = (Engine.NATIVE.value,)
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
    if not 1 <= gpus <= MAX_GPUS:
        raise UserError(f"the GPU count must be between 1 and {MAX_GPUS:,} (got {gpus})")
    if not 1 <= global_batch <= MAX_COUNT:
        raise UserError(f"the global batch must be between 1 and {MAX_COUNT:,} "
                        f"(got {global_batch})")
    tps = space.tp or tuple(d for d in divisors(gpus) if d <= space.max_tp)
    bad_tp = [t for t in tps if gpus % t]
    if bad_tp:
        raise UserError(f"tp {bad_tp[0]} does not divide the {gpus} GPUs")
    micro = space.micro_batch or tuple(
        b for b in (1, 2, 4, 8, 16, 32) if b <= space.max_micro_batch)
    blocks = []
    registry: dict[Sharding, int] = {}
    for tp in tps:
        pps = space.pp or tuple(d for d in divisors(gpus // tp) if d <= model.layers)
        for pp in pps:
            if (gpus // tp) % pp:
                continue
            dp = gpus // (tp * pp)
            shard = space.sharding or tuple(_shardings(system, tp, dp))
            block = _product(model, tp, pp, dp, micro, _schedules(model, pp, space), space,
                             shard, global_batch, registry)
            if block is not None:
                blocks.append(block)
    if not blocks:
        raise UserError(f"no tp x pp x dp layout of {gpus} GPUs matches the requested degrees")
    sizes = np.array([b.pop("_n") for b in blocks])
    cols = {k: np.repeat(np.array([b[k] for b in blocks]), sizes)
            if isinstance(blocks[0][k], _Const) else np.concatenate([b[k] for b in blocks])
            for k in blocks[0]}
    # Knobs the space does not enumerate keep the Layout's default.
    cols = fill_defaults(cols, int(sizes.sum()))
    sharding_id, engine_model = cols.pop("_sharding_id"), cols.pop("_engine_model")
    table = LayoutTable(**cols)
    engine_layout = _engine_layout_codes(table, sharding_id, list(registry))
    return table, _reasons(model, table, engine_layout, engine_model)


def _schedules(model: ModelSpec, pp: int, space: SearchSpace) -> list[tuple[int, int]]:
    """(schedule code, virtual stages) pairs for a pipeline of ``pp`` stages."""
    out = []
    for name in map(Schedule, space.schedule):
        if name != Schedule.INTERLEAVED:
            out.append((name.code, 1))
        elif pp > 1:  # interleaving without a pipeline is not a layout
            # v dividing the (smallest even share of) layers per stage: with an uneven split the
            # engine's split decides the chunks (specs/pipeline_split.py).
            vs = space.virtual_stages or tuple(v for v in divisors(model.layers // pp) if v > 1)
            out += [(name.code, v) for v in vs if v > 1]
    return out


def _product(model, tp, pp, dp, micro, sched_v, space, shardings, global_batch,
             registry: dict) -> dict | None:
    rec = [Recompute(r).code for r in space.recompute]
    # Sequence parallelism without TP and interleaving without a pipeline are not layouts.
    sp = [s for s in space.sequence_parallel if tp > 1 or not s]
    if not sched_v:
        return None
    engines = tuple(Engine.parse(e, "engine") for e in space.engine)
    shard_rows = [list(encode("sharding", s).values()) for s in shardings]
    grids = np.meshgrid(
        np.arange(len(micro)), np.arange(len(sched_v)), np.arange(len(rec)),
        np.arange(len(sp)), np.arange(len(space.flash_attention)), np.arange(len(shard_rows)),
        np.arange(len(engines)), indexing="ij",
    )
    i_mb, i_sv, i_rc, i_sp, i_fa, i_sh, i_en = (g.ravel() for g in grids)
    n = len(i_mb)
    sv = np.array(sched_v)
    sh = np.array(shard_rows)
    cols = {
        # Constant in a block: one value, repeated when the blocks are joined.
        "tp": _Const(tp), "pp": _Const(pp), "dp": _Const(dp),
        "micro_batch": np.array(micro)[i_mb], "global_batch": _Const(global_batch),
        "schedule": sv[i_sv, 0], "virtual_stages": sv[i_sv, 1],
        "sequence_parallel": np.array(sp, dtype=bool)[i_sp],
        "recompute": np.array(rec)[i_rc],
        "flash_attention": np.array(space.flash_attention, dtype=bool)[i_fa],
        "dtype": _Const(DType(space.dtype).code),
        "engine": np.array([e.code for e in engines])[i_en],
    }
    for j, col in enumerate(encode("sharding", shardings[0])):
        cols[col] = sh[i_sh, j]
    # Each sharding's number in the plan-wide registry: the engine rules look it up (_reasons).
    cols["_sharding_id"] = np.array([registry.setdefault(x, len(registry))
                                     for x in shardings])[i_sh]
    cols["_engine_model"] = _model_codes(model, tp, pp, tuple(sched_v), engines)[i_en, i_sv]
    cols["_n"] = n
    return cols


class _Const(int):
    """A column's one value in a block."""


def _model_codes(model, tp, pp, sched_v, engines) -> np.ndarray:
    """Per (engine, schedule) of a block, the first broken rule against the model that
    depends on the engine: the empty chunk (check_model's order: before the engine's own
    rules), then EngineRules.broken's model rules."""
    mod = np.zeros((len(engines), len(sched_v)), dtype=np.int16)
    for e, engine in enumerate(engines):
        r = RULES[engine]
        for j, (_, v) in enumerate(sched_v):
            chunks = pp * v
            even = model.layers % chunks == 0
            # An even split has layers / chunks >= 1 each; only DeepSpeed's weighs the ends.
            if chunks > 1 and (not even or r.pipeline_split == "parameters") \
                    and min_chunk_layers(model, pp, v, engine) < 1:
                mod[e, j] = _EMPTY_CHUNK
            elif not r.uneven_interleaved and v > 1 and not even:
                mod[e, j] = ENGINE_REASON[(engine, "uneven_interleaved")]
            elif r.whole_kv_heads and model.kv_heads < tp:
                mod[e, j] = ENGINE_REASON[(engine, "whole_kv_heads")]
            elif r.vocab_divisible and model.vocab % tp:
                mod[e, j] = ENGINE_REASON[(engine, "vocab_tp")]
    return mod


def _engine_layout_codes(t: LayoutTable, sharding_id: np.ndarray,
                         shardings: list[Sharding]) -> np.ndarray:
    """Each row's first broken engine rule of the layout alone (EngineRules.broken's order), 0
    for none. The rules read a few small knobs, so they are worked out once on the grid of those
    knobs' values and each row looks its answer up (one gather, not a pass per rule)."""
    few = t.global_batch // (t.micro_batch * t.dp) < t.pp
    dims = (len(Engine), 2, 2, len(Schedule), len(DType), 2, len(Recompute), len(shardings))
    grid = np.meshgrid(*(np.arange(d) for d in dims), indexing="ij")
    table = _first_engine_rule(*(g.ravel() for g in grid), shardings)
    flat = np.ravel_multi_index(
        (t.engine, t.pp > 1, few, t.schedule, t.dtype, t.sequence_parallel, t.recompute,
         sharding_id), dims)
    return table[flat]


def _first_engine_rule(eng, multi, few, schedule, dtype, sp, recompute, sharding_id,
                       shardings: list[Sharding]) -> np.ndarray:
    """The first engine rule of the layout alone each combination breaks (0 for none)."""
    engines = list(Engine)
    rules = [RULES[e] for e in engines]
    runs = np.array([[r.runs_sharding(x) for x in shardings] for r in rules], dtype=bool)
    pipe = np.array([[r.runs_sharding(x, pipeline=True) for x in shardings] for r in rules],
                    dtype=bool)
    sched_bad = np.array([[s not in r.schedules for s in Schedule] for r in rules])
    dtype_bad = np.array([[d not in r.dtypes for d in DType] for r in rules])
    sp_bad = np.array([not r.sequence_parallel for r in rules])
    rec_bad = np.array([[x not in r.recomputes for x in Recompute] for r in rules])
    mb_bad = np.array([[s in r.microbatch_per_stage for s in Schedule] for r in rules])
    multi, few, sp = multi.astype(bool), few.astype(bool), sp.astype(bool)

    def code(rule: str) -> np.ndarray:
        return np.array([ENGINE_REASON.get((e, rule), 0) for e in engines], dtype=np.int16)

    broken = [
        (multi & sched_bad[eng, schedule], code("schedule")),
        (dtype_bad[eng, dtype], code("dtype")),
        (sp & sp_bad[eng], code("sequence_parallel")),
        (~runs[eng, sharding_id], code("sharding")),
        (multi & ~pipe[eng, sharding_id], code("pipeline_sharding")),
        (rec_bad[eng, recompute], code("recompute")),
        (multi & mb_bad[eng, schedule] & few, code("pipeline_microbatches")),
    ]
    out = np.zeros(len(eng), dtype=np.int16)
    for mask, codes in reversed(broken):  # the first rule broken wins
        out[mask] = codes[eng[mask]]
    return out


def _reasons(model: ModelSpec, t: LayoutTable, engine_layout: np.ndarray,
             engine_model: np.ndarray) -> np.ndarray:
    """The first rule each layout breaks (index into REASONS), 0 when it breaks none.
    ``engine_layout`` / ``engine_model``: each row's first broken engine rule of the layout alone
    and against the model (the empty chunk among the latter), 0 for none."""
    mb_dp = t.micro_batch * t.dp
    m = t.global_batch // mb_dp
    partial = np.zeros(len(t), dtype=bool)
    for comp in COMPONENTS:
        kind = getattr(t, f"{comp}_kind")
        group = np.maximum(getattr(t, f"{comp}_group"), 1)
        partial |= (kind == PlacementKind.PARTIAL.code) & (t.dp % group != 0)
    empty = engine_model == _EMPTY_CHUNK
    engine_only = np.where(empty, 0, engine_model)
    # (rule broken, its code), in the order Layout checks them.
    rules = [
        (t.global_batch % mb_dp != 0, REASONS.index(_LAYOUT_REASONS[0])),
        ((t.schedule == Schedule.INTERLEAVED.code) & (m % t.pp != 0),
         REASONS.index(_LAYOUT_REASONS[1])),
        (partial, REASONS.index(_LAYOUT_REASONS[2])),
        (engine_layout != 0, engine_layout),
        (model.heads % t.tp != 0, REASONS.index(_MODEL_REASONS[0])),
        ((model.kv_heads % t.tp != 0) & (t.tp % model.kv_heads != 0),
         REASONS.index(_MODEL_REASONS[1])),
        (model.ffn_hidden % t.tp != 0, REASONS.index(_MODEL_REASONS[2])),
        (empty, _EMPTY_CHUNK),
        (t.sequence_parallel & (model.seq_len % t.tp != 0), REASONS.index(_MODEL_REASONS[4])),
        (engine_only != 0, engine_only),
    ]
    reason = np.zeros(len(t), dtype=np.int16)
    for broken, code in reversed(rules):  # the first rule broken wins
        reason[broken] = code[broken] if isinstance(code, np.ndarray) else code
    return reason
