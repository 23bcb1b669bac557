"""The search space: every combination of layout knobs for a model on N GPUs, with the rule each
rejected combination breaks.

Enumeration is a cartesian product built with numpy (no Python loop per layout), so a space of
hundreds of thousands of layouts costs a fraction of a second. Combinations that are not layouts
at all (tp·pp·dp ≠ N) are never generated; every other rule is a rejection with a reason, so the
planner can say how many layouts each rule removed.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from frontier_llm.costmodel.dualpipe_rules import DUALPIPE_REASONS, dualpipe_codes
from frontier_llm.costmodel.layouts import LayoutTable, encode, fill_defaults
from frontier_llm.errors import UserError
from frontier_llm.specs import axes
from frontier_llm.specs.engine_rules import LAYOUT_RULES, MODEL_RULES, ONLY_KNOBS, RULES
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
    Vocabulary,
    layout_types,
    zero_preset,
)
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.pipeline_split import min_chunk_layers
from frontier_llm.specs.space import open_values, space_knobs
from frontier_llm.specs.system import SystemSpec

# Rejection reasons, by code (0 = valid). In the order Layout checks them, so both name the
# same first broken rule: the layout's own rules, its engine's rules of the layout alone (one
# reason per engine and rule, naming the engine), the rules against the model, the engine's rules
# against the model, and last the cost model's "does not fit in memory".
_LAYOUT_REASONS = (
    "ep x expert-tp does not divide tp x dp x cp",
    "global_batch not divisible by micro_batch x dp",
    "interleaved needs micro-batches to be a multiple of pp",
    "partial sharding group does not divide dp x cp",
)
_MODEL_REASONS = (
    "heads not divisible by tp",
    "kv_heads and tp do not divide one another",
    "ffn_hidden not divisible by tp",
    "ep > 1 needs a Mixture-of-Experts model",
    "num_experts not divisible by ep",
    "expert_ffn_hidden not divisible by expert-tp",
    "a pipeline chunk without layers",
    "seq_len not divisible by 2 x cp",
    "seq_len / cp not divisible by tp (sequence parallel)",
)

# Against the system's node: the cost model prices a group of ranks by its span, at the node's
# links when the span fits in a node. A span that does not divide the node (tp 3 on 8 GCDs) puts
# some groups across two nodes once the job has more than one, and a synchronous step waits for
# the slowest group: such a layout is refused rather than priced at in-node speed.
NODE_REASONS = (
    "a tp x cp group crosses a node (its size does not divide gpus_per_node)",
    "an expert-parallel group crosses a node (ep x expert-tp does not divide gpus_per_node)",
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
    *NODE_REASONS,
    # The run's rules (costmodel/dualpipe_rules.py), met only under --moe-overlap dualpipe.
    *DUALPIPE_REASONS,
    "does not fit in memory",
)
OOM = REASONS.index("does not fit in memory")
# (engine, rule) -> its code in REASONS.
ENGINE_REASON = {key: REASONS.index(RULES[key[0]].reason(key[1]))
                 for key in (*_ENGINE_LAYOUT, *_ENGINE_MODEL)}
_EMPTY_CHUNK = REASONS.index("a pipeline chunk without layers")


def _no_layout(space: SearchSpace, gpus: int) -> str:
    """Why no layout of ``gpus`` GPUs fits the requested degrees, naming each one asked for
    (a --cp of 3 on 4 GPUs was reported as a tp x pp x dp problem)."""
    asked = {k: v for k in ("tp", "cp", "pp", "ep") if (v := getattr(space, k, None))}
    shown = ", ".join(f"{k} {'/'.join(map(str, v))}" for k, v in asked.items())
    bad = [f"{k} {d}" for k, v in asked.items() if k != "ep" for d in v if gpus % d]
    why = f"; {gpus} is not a multiple of {', '.join(bad)}" if bad else ""
    return (f"no tp x cp x pp x dp layout of {gpus} GPUs matches the requested degrees"
            + (f" ({shown}{why})" if shown else ""))


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


# Candidate values for each knob of specs.space (None: the knob is open, and takes its open
# list: specs.space.open_values, or for numbers and the sharding the lists worked out here), the
# precision, and the bounds of the open tp and micro-batch lists. Its knob fields are made from
# the Layout fields, not written out.
SearchSpace = dataclasses.make_dataclass(
    "SearchSpace",
    [(n, tuple | None, dataclasses.field(default=None)) for n in space_knobs()]
    + [("dtype", str, dataclasses.field(default=DType.BF16.value)),
       ("max_tp", int, dataclasses.field(default=64)),
       ("max_micro_batch", int, dataclasses.field(default=16))],
    frozen=True)
SearchSpace.__module__ = __name__
SearchSpace.__doc__ = ("Candidate values for each layout knob (None: open, the planner's "
                       "list), the precision, and bounds of the open tp and micro-batch lists.")


# Knobs enumerated by rules of their own (the degrees per block of one tp x pp, the schedule with
# its interleaving depths, sequence parallelism only with tp > 1, the sharding's six columns, the
# engine for its model rules); every other knob is one column of its values (_product).
STRUCTURAL = ("tp", "cp", "pp", "ep", "schedule", "virtual_stages", "sequence_parallel", "sharding",
              "engine", axes.EXPERT_TP)


def knob_values(space: SearchSpace, name: str) -> tuple | None:
    """The values of knob ``name`` the space searches: its list, else the knob's open list
    (None where it is worked out from the model and GPU count)."""
    given = getattr(space, name)
    return tuple(given) if given is not None else open_values(name)


def open_degrees(name: str, model: ModelSpec, gpus: int, space: SearchSpace | None = None,
                 pps: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The open list of a degree over a whole GPU count, as one list (a study's parameter): tp
    every divisor up to ``max_tp``, pp every divisor up to the layers, virtual stages every
    v > 1 that divides the (smallest even share of) layers of a stage for some pp of ``pps``.
    The enumeration itself narrows them per block (pp divides what tp leaves)."""
    space = space or SearchSpace()
    if name == "tp":
        return tuple(d for d in divisors(gpus) if d <= space.max_tp)
    if name == "pp":
        return tuple(d for d in divisors(gpus) if d <= model.layers)
    if name == "cp":
        return open_cp(model, gpus)
    if name == "ep":
        return open_ep(model, gpus)
    if name == "virtual_stages":
        return tuple(sorted({v for pp in pps for v in _depths(model, pp)}))
    raise ValueError(f"{name} has no open list of its own")


# The fewest tokens of a sequence a context-parallel rank is given in the open cp list: 4,096.
# The sources run CP only on long sequences with shares at or above it: Megatron-LM's CP
# documentation splits 8K tokens over cp 2 (4K a rank), Llama 3 (Dubey et al. 2024, §3.3.2)
# trained 128K contexts with cp 16 (8K a rank). Below it a rank's attention is too short to
# cover the K/V exchange, the activations CP saves are small beside the model states, and the
# search stays the size it was for the short-context plans (seq_len <= 4,096: cp 1 only). A
# listed cp (--cp, a sweep's space) is searched whatever its share.
MIN_CP_TOKENS = 4096


def open_cp(model: ModelSpec, gpus: int) -> tuple[int, ...]:
    """The open cp list over ``gpus`` (the GPUs a tp leaves): 1 and the powers of two that
    divide ``gpus``, cut the sequence into ``2·cp`` equal chunks (the load-balanced causal
    split) and leave every rank at least :data:`MIN_CP_TOKENS` tokens. Powers of two: the
    split's chunks, the rings and the node sizes (8 GCDs or GPUs) are all powers of two."""
    out, cp = [1], 2
    while cp <= gpus and model.seq_len // cp >= MIN_CP_TOKENS:
        if gpus % cp == 0 and model.seq_len % (2 * cp) == 0:
            out.append(cp)
        cp *= 2
    return tuple(out)


def open_ep(model: ModelSpec, shard_ranks: int) -> tuple[int, ...]:
    """The open ep list over ``shard_ranks`` (the dp x cp ranks a block's other degrees leave,
    which expert parallelism re-folds: specs/axes.py): 1 for a dense model; for an MoE model 1
    and the powers of two that divide both ``shard_ranks`` and ``num_experts`` (the experts
    split evenly; expert counts, node sizes and all-to-all groups are powers of two in the
    sources: Mixtral's 8, DeepSeek-V3's 256 over EP 64). A listed ep (--ep, a sweep's space)
    is searched whatever it is."""
    out, ep = [1], 2
    while model.is_moe and ep <= min(shard_ranks, model.num_experts):
        if shard_ranks % ep == 0 and model.num_experts % ep == 0:
            out.append(ep)
        ep *= 2
    return tuple(out)


def open_etp(model: ModelSpec, tp: int) -> tuple[int, ...]:
    """The open etp list under ``tp`` (stored 0 = tp: specs/axes.py): tp alone for a dense
    model; for an MoE model also 1, the fold Megatron-Core's MoE parallel folding is built for
    and the other of the two torchtitan v0.2.2 runs ("etp = tp or etp = 1",
    distributed/parallel_dims.py)."""
    return (0, 1) if model.is_moe and tp > 1 else (0,)


def _expert_folds(model: ModelSpec, space: SearchSpace, tp: int, shard_ranks: int
                  ) -> list[tuple[int, int]]:
    """(etp, ep) pairs of one tp x cp x dp block: each etp of the space's list (a listed etp
    equal to tp is stored 0) with the ep list over the ranks it leaves, tp x dp x cp / etp
    (specs/axes.py: the experts re-fold the stage), so etp 1 lets ep span tp ranks."""
    given = getattr(space, axes.EXPERT_TP, None)
    if given and not model.is_moe and any(e not in (0, tp) for e in given):
        raise UserError(f"etp applies to Mixture-of-Experts models only ({model.name} is dense)")
    etps = tuple(dict.fromkeys(0 if e == tp else e for e in given)) if given else open_etp(
        model, tp)
    out = []
    for etp in etps:
        ranks = shard_ranks if etp == 0 else tp * shard_ranks // etp
        if etp and (tp * shard_ranks) % etp:
            continue
        out += [(etp, ep) for ep in space.ep or open_degrees("ep", model, ranks, space)]
    return out


def _depths(model: ModelSpec, pp: int) -> tuple[int, ...]:
    """Interleaving depths for a pipeline of ``pp`` stages: v dividing the (smallest even share
    of) layers per stage; with an uneven split the engine's split decides the chunks
    (specs/pipeline_split.py)."""
    return tuple(v for v in divisors(model.layers // pp) if v > 1) if pp > 1 else ()


def _shardings(system: SystemSpec, tp: int, dp: int) -> list[Sharding]:
    """ZeRO-0..3 plus AMSP's partial placements over the DP ranks that share a node. ``dp`` is
    the ranks sharing parameters, dp x cp: they are ``tp`` apart with cp inner (rank order tp,
    cp, dp, pp), so ``k`` consecutive of them span ``tp·k`` ranks, one node for
    ``k = gpus_per_node / tp``, whatever the cp."""
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
    tps = space.tp or open_degrees("tp", model, gpus, space)
    bad_tp = [t for t in tps if gpus % t]
    if bad_tp:
        raise UserError(f"tp {bad_tp[0]} does not divide the {gpus} GPUs")
    micro = space.micro_batch or tuple(
        b for b in (1, 2, 4, 8, 16, 32) if b <= space.max_micro_batch)
    blocks = []
    registry: dict[Sharding, int] = {}
    for tp in tps:
        for cp in space.cp or open_degrees("cp", model, gpus // tp, space):
            if (gpus // tp) % cp:
                continue
            rest = gpus // (tp * cp)
            pps = space.pp or tuple(d for d in divisors(rest) if d <= model.layers)
            for pp in pps:
                if rest % pp:
                    continue
                dp = rest // pp
                shard = tuple(map(Sharding.parse, space.sharding or ())) or tuple(
                    _shardings(system, tp, dp * cp))
                for etp, ep in _expert_folds(model, space, tp, dp * cp):
                    block = _product(model, (tp, cp, pp, dp, ep), micro,
                                     _schedules(model, pp, space), space, shard, global_batch,
                                     registry, etp)
                    if block is not None:
                        blocks.append(block)
    if not blocks:
        raise UserError(_no_layout(space, gpus))
    sizes = np.array([b.pop("_n") for b in blocks])
    cols = {k: np.repeat(np.array([b[k] for b in blocks]), sizes)
            if isinstance(blocks[0][k], _Const) else np.concatenate([b[k] for b in blocks])
            for k in blocks[0]}
    # Knobs the space does not enumerate keep the Layout's default.
    cols = fill_defaults(cols, int(sizes.sum()))
    sharding_id, engine_model = cols.pop("_sharding_id"), cols.pop("_engine_model")
    table = LayoutTable(**cols)
    engine_layout = _engine_layout_codes(table, sharding_id, list(registry))
    reason = _reasons(model, table, engine_layout, engine_model)
    return table, _node_reasons(reason, table, system.gpus_per_node, gpus)


def _schedules(model: ModelSpec, pp: int, space: SearchSpace) -> list[tuple[int, int]]:
    """(schedule code, virtual stages) pairs for a pipeline of ``pp`` stages."""
    out = []
    for name in map(Schedule, knob_values(space, "schedule")):
        if name != Schedule.INTERLEAVED:
            out.append((name.code, 1))
        elif pp > 1:  # interleaving without a pipeline is not a layout
            vs = space.virtual_stages or _depths(model, pp)
            out += [(name.code, v) for v in vs if v > 1]
    return out


def _product(model, degrees, micro, sched_v, space, shardings, global_batch,
             registry: dict, etp: int = 0) -> dict | None:
    tp, cp, pp, dp, ep = degrees
    # Sequence parallelism without TP and interleaving without a pipeline are not layouts.
    sp = [s for s in knob_values(space, "sequence_parallel") if tp > 1 or not s]
    if not sched_v:
        return None
    engines = tuple(Engine.parse(e, "engine") for e in knob_values(space, "engine"))
    shard_rows = [list(encode("sharding", s).values()) for s in shardings]
    # Every other knob: one dimension of its values' codes (a knob added to Layout is
    # enumerated here with no edit, over its listed or open values).
    plain = {name: [_code(name, v) for v in (micro if name == "micro_batch"
                                             else knob_values(space, name))]
             for name in space_knobs() if name not in STRUCTURAL}
    # One dimension per knob, in field order (the schedule's carries its interleaving depths).
    own = {"schedule": sched_v, "sequence_parallel": sp, "sharding": shard_rows,
           "engine": engines}
    dims = {("_sv" if n == "schedule" else n): own[n] if n in own else plain[n]
            for n in space_knobs() if n in own or n in plain}
    grids = np.meshgrid(*(np.arange(len(v)) for v in dims.values()), indexing="ij")
    idx = dict(zip(dims, (g.ravel() for g in grids), strict=True))
    n = len(idx["_sv"])
    sv = np.array(sched_v)
    sh = np.array(shard_rows)
    cols = {
        # Constant in a block: one value, repeated when the blocks are joined.
        "tp": _Const(tp), "cp": _Const(cp), "pp": _Const(pp), "dp": _Const(dp),
        "ep": _Const(ep), axes.EXPERT_TP: _Const(etp), "global_batch": _Const(global_batch),
        "schedule": sv[idx["_sv"], 0], "virtual_stages": sv[idx["_sv"], 1],
        "sequence_parallel": np.array(sp, dtype=bool)[idx["sequence_parallel"]],
        "dtype": _Const(DType(space.dtype).code),
        "engine": np.array([e.code for e in engines])[idx["engine"]],
    }
    for name, values in plain.items():
        cols[name] = np.array(values)[idx[name]]
    for j, col in enumerate(encode("sharding", shardings[0])):
        cols[col] = sh[idx["sharding"], j]
    # Each sharding's number in the plan-wide registry: the engine rules look it up (_reasons).
    cols["_sharding_id"] = np.array([registry.setdefault(x, len(registry))
                                     for x in shardings])[idx["sharding"]]
    cols["_engine_model"] = _model_codes(model, tp, pp, tuple(sched_v),
                                         engines)[idx["engine"], idx["_sv"]]
    cols["_n"] = n
    return cols


def _code(name: str, value):
    """A knob's value as its column value (a vocabulary word as its code)."""
    kind = layout_types()[name]
    if isinstance(kind, type) and issubclass(kind, Vocabulary):
        return kind.parse(value, name).code
    return kind(value)


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
    out = table[flat]
    # The engines' value rules on other knobs (EngineRules.only), in their order, after the
    # rules above: one lookup per knob of (engine, the knob's code).
    for knob in ONLY_KNOBS:
        allowed = [{k: vals for k, vals, _ in RULES[e].only}.get(knob) for e in Engine]
        code = np.array([ENGINE_REASON.get((e, f"only_{knob}"), 0) for e in Engine],
                        dtype=np.int16)
        col = getattr(t, knob)
        kind = layout_types()[knob]
        if kind is int:  # a number (cp): compare with each engine's allowed values
            bad_row = np.zeros(len(col), dtype=bool)
            for e in Engine:
                if allowed[e.code] is not None:
                    mine = t.engine == e.code
                    bad_row |= mine & ~np.isin(col, np.array(allowed[e.code]))
        else:
            values = (False, True) if kind is bool else tuple(kind)
            bad = np.array([[a is not None and v not in a for v in values] for a in allowed])
            bad_row = bad[t.engine, col.astype(np.int64)]
        hit = (out == 0) & bad_row
        out[hit] = code[t.engine[hit]]
    return out


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


def _node_reasons(reason: np.ndarray, t: LayoutTable, per_node: int, gpus: int) -> np.ndarray:
    """``reason`` with the node rules (:data:`NODE_REASONS`) set on the layouts that break
    no earlier rule. A job within one node keeps every group inside it."""
    if gpus <= per_node:
        return reason
    reason = reason.copy()
    # A group of span s <= per_node starts at multiples of s: inside a node iff s divides it.
    for span, text in ((t.tp * t.cp, NODE_REASONS[0]),
                       (axes.expert_stride(t) * t.ep, NODE_REASONS[1])):
        crosses = (span < per_node) & (per_node % np.maximum(span, 1) != 0) & (reason == 0)
        reason[crosses] = REASONS.index(text)
    return reason


def dualpipe_reasons(reason: np.ndarray, t: LayoutTable) -> np.ndarray:
    """``reason`` with DualPipe's rules (:data:`DUALPIPE_REASONS`) set on the layouts that
    break no earlier rule: a run under ``--moe-overlap dualpipe`` keeps one schedule label, an
    even pp and the engines that state it (costmodel/dualpipe_rules.py)."""
    reason = reason.copy()
    codes = dualpipe_codes(t.pp, t.schedule, t.engine)
    hit = (reason == 0) & (codes > 0)
    first = REASONS.index(DUALPIPE_REASONS[0])
    reason[hit] = first + codes[hit] - 1
    return reason


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
        # Sharded state spans dp x cp (Layout.shard_ranks).
        partial |= (kind == PlacementKind.PARTIAL.code) & (t.shard_ranks % group != 0)
    empty = engine_model == _EMPTY_CHUNK
    engine_only = np.where(empty, 0, engine_model)
    # (rule broken, its code), in the order Layout checks them.
    expert_width = model.expert_ffn_hidden if model.is_moe else model.ffn_hidden
    expert_tp = axes.expert_tensor_parallel(t)
    rules = [
        # ep x etp folds a stage's tp x cp x dp ranks (dp x cp % ep with etp = tp).
        ((t.tp * t.shard_ranks) % (expert_tp * t.ep) != 0, REASONS.index(_LAYOUT_REASONS[0])),
        (t.global_batch % mb_dp != 0, REASONS.index(_LAYOUT_REASONS[1])),
        ((t.schedule == Schedule.INTERLEAVED.code) & (m % t.pp != 0),
         REASONS.index(_LAYOUT_REASONS[2])),
        (partial, REASONS.index(_LAYOUT_REASONS[3])),
        (engine_layout != 0, engine_layout),
        (model.heads % t.tp != 0, REASONS.index(_MODEL_REASONS[0])),
        ((model.kv_heads % t.tp != 0) & (t.tp % model.kv_heads != 0),
         REASONS.index(_MODEL_REASONS[1])),
        (model.ffn_hidden % t.tp != 0, REASONS.index(_MODEL_REASONS[2])),
        ((t.ep > 1) & (not model.is_moe), REASONS.index(_MODEL_REASONS[3])),
        (model.num_experts % t.ep != 0, REASONS.index(_MODEL_REASONS[4])),
        (model.is_moe & (expert_width % expert_tp != 0), REASONS.index(_MODEL_REASONS[5])),
        (empty, _EMPTY_CHUNK),
        ((t.cp > 1) & (model.seq_len % (2 * t.cp) != 0), REASONS.index(_MODEL_REASONS[7])),
        (t.sequence_parallel & ((model.seq_len // t.cp) % t.tp != 0),
         REASONS.index(_MODEL_REASONS[8])),
        (engine_only != 0, engine_only),
    ]
    reason = np.zeros(len(t), dtype=np.int16)
    for broken, code in reversed(rules):  # the first rule broken wins
        reason[broken] = code[broken] if isinstance(code, np.ndarray) else code
    return reason
