"""Plan: evaluate every candidate layout with the cost model and rank the ones that fit."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from frontier_llm.costmodel import evaluate
from frontier_llm.costmodel.dualpipe_rules import DUALPIPE_ENGINES
from frontier_llm.costmodel.fp8 import check_fp8
from frontier_llm.costmodel.layouts import LayoutTable
from frontier_llm.costmodel.moe import NO_OVERLAP, MoeRun
from frontier_llm.errors import UserError
from frontier_llm.planner.intervals import memory_group, memory_width
from frontier_llm.planner.space import (
    OOM,
    REASONS,
    SearchSpace,
    dualpipe_reasons,
    enumerate_layouts,
)
from frontier_llm.specs.layout import (
    MAX_GPUS,
    DType,
    Layout,
    Sharding,
    Vocabulary,
    layout_fields,
    layout_types,
)
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec

# The predicted figures a plan's rows carry, beside the layout's columns.
PREDICTION_COLUMNS = ("step_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "hfu",
                      "peak_memory_bytes", "fits", "memory_tight")
# Tokens per iteration the default global batch aims for: GPT-3 175B trained with 3.2M-token
# batches (Brown et al. 2020); 4M rounds that up.
DEFAULT_BATCH_TOKENS = 4 * 1024 * 1024


def default_global_batch(model: ModelSpec, gpus: int) -> int:
    """DEFAULT_BATCH_TOKENS tokens in whole sequences, rounded up to a multiple of the largest
    divisor of the GPU count that is at most that many sequences: every data-parallel degree
    dividing that divisor divides the batch, and the batch holds at least 4M tokens and fewer
    than 8M. (Rounding up to a multiple of the GPU count itself made 1,024 sequences of a 128K
    context on 1,024 GPUs: 134M tokens a step.) With more GPUs than sequences, the layouts
    whose data-parallel degree the batch cannot split are rejected for it."""
    sequences = math.ceil(DEFAULT_BATCH_TOKENS / model.seq_len)
    step = max(d for d in _divisors(gpus) if d <= sequences)
    return step * math.ceil(sequences / step)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in small]


@dataclass
class Plan:
    """Every evaluated layout (``layouts``, ``figures``) and the rule each rejected one broke."""

    model: ModelSpec
    system: SystemSpec
    gpus: int
    global_batch: int
    layouts: LayoutTable
    figures: dict[str, np.ndarray]
    reason: np.ndarray
    _order: np.ndarray | None = field(default=None, repr=False)

    @property
    def valid(self) -> np.ndarray:
        return self.reason == 0

    def order(self) -> np.ndarray:
        """Indices of valid layouts: those that fit, then the tight ones whose point estimate
        of peak memory is within the device, then the tight ones whose point estimate is over
        it; fastest first within each group (ties: less memory first)."""
        if self._order is None:
            idx = np.flatnonzero(self.valid)
            keys = (self.figures["peak_memory_bytes"][idx], -self.figures["tokens_per_s"][idx],
                    self.memory_group()[idx])
            self._order = idx[np.lexsort(keys)]
        return self._order

    def memory_group(self) -> np.ndarray:
        """Per row, how sure the plan is that it fits: 0 its whole memory interval fits, 1 it
        is tight (the interval straddles the device) with the point estimate within the
        device, 2 tight with the point estimate over it. A tight layout ranked by speed alone
        put one predicted over the capacity before a slower one predicted under it."""
        tight = self.figures.get("memory_tight", np.zeros(len(self.reason), dtype=bool))
        return memory_group(tight, self.figures["peak_memory_bytes"], self.system.memory_bytes)

    def rejections(self) -> dict[str, int]:
        counts = np.bincount(self.reason, minlength=len(REASONS))
        return {REASONS[i]: int(c) for i, c in enumerate(counts) if i and c}

    def frame(self, index: np.ndarray | None = None) -> pd.DataFrame:
        """Layouts and predictions as a DataFrame (all rows, or ``index``)."""
        t = self.layouts if index is None else self.layouts.take(index)
        f = self.figures if index is None else {k: v[index] for k, v in self.figures.items()}
        r = self.reason if index is None else self.reason[index]
        df = pd.DataFrame(layout_columns(t))
        for k in PREDICTION_COLUMNS:
            df[k] = f[k]
        df["reject_reason"] = pd.Categorical.from_codes(r, REASONS)
        return df

    @property
    def table(self) -> pd.DataFrame:
        return self.frame()

    def ranked(self, top: int | None = None, fits_only: bool = True,
               frontier: bool = False) -> pd.DataFrame:
        """Valid layouts, fastest first; with ``fits_only=False`` the ones that do not fit in
        memory are ranked too (after those that do); with ``frontier`` only the non-dominated
        ones (:func:`non_dominated`)."""
        df = self.frame(self.ranked_indices(top, fits_only, frontier))
        df.insert(0, "rank", np.arange(1, len(df) + 1))
        return df.reset_index(drop=True)

    def ranked_indices(self, top: int | None = None, fits_only: bool = True,
                       frontier: bool = False) -> np.ndarray:
        """The rows of :meth:`ranked`, as indices for :meth:`layout` and :meth:`prediction`."""
        idx = self.order()
        if frontier:
            idx = self._frontier(idx)
        if not fits_only:
            oom = np.flatnonzero(self.reason == OOM)
            oom = oom[np.lexsort((self.figures["peak_memory_bytes"][oom],
                                  -self.figures["tokens_per_s"][oom]))]
            if frontier:
                oom = oom[non_dominated(self.figures["peak_memory_bytes"][oom])]
            idx = np.concatenate([idx, oom])
        return idx if top is None else idx[:top]

    def _frontier(self, idx: np.ndarray) -> np.ndarray:
        """The non-dominated layouts of ``order()``, group by group (:meth:`memory_group`):
        those that fit, then the tight ones under the capacity that are faster than every
        layout before them, then the tight ones over it that are faster still (a later group's
        layout needs more memory than an earlier one's, so a slower one is dominated), each
        group fastest first."""
        group = self.memory_group()[idx]
        mem, tps = self.figures["peak_memory_bytes"], self.figures["tokens_per_s"]
        kept: list[np.ndarray] = []
        fastest = -np.inf
        for g in range(3):
            members = idx[group == g]
            members = members[tps[members] > fastest]
            members = members[non_dominated(mem[members])]
            if len(members):
                fastest = max(fastest, float(tps[members].max()))
            kept.append(members)
        return np.concatenate(kept)

    def layout(self, i: int) -> Layout:
        """Row ``i`` as a Layout object (what the sweep turns into a job)."""
        return self.layouts.config(int(i))

    def prediction(self, i: int) -> dict:
        """Row ``i``'s headline figures as plain Python values (a sweep job's prediction)."""
        return {k: self.figures[k][int(i)].item() for k in PREDICTION_COLUMNS
                if k != "hfu"}

    def best(self) -> Layout | None:
        order = self.order()
        return self.layout(int(order[0])) if len(order) else None


def non_dominated(memory_in_rank_order: np.ndarray) -> np.ndarray:
    """Which layouts, given fastest first (ties: less memory first), no other layout dominates:
    none earlier is at least as fast with no more memory. Walking down the ranking, a layout
    stays only if it needs strictly less memory than every faster one (the Pareto frontier of
    throughput and memory; a layout tied with an earlier one in both is dropped too)."""
    mem = np.asarray(memory_in_rank_order, dtype=float)
    if not len(mem):
        return np.zeros(0, dtype=bool)
    least_before = np.minimum.accumulate(np.concatenate([[np.inf], mem[:-1]]))
    return mem < least_before


def layout_columns(t: LayoutTable) -> dict[str, object]:
    """The plan's layout columns, one per Layout field: numbers and booleans as they are,
    vocabularies as categoricals of their words, the sharding as its text form."""
    out: dict[str, object] = {}
    for name, kind in layout_types().items():
        if kind is Sharding:
            out[name] = _sharding_labels(t)
        elif issubclass(kind, Vocabulary):
            out[name] = pd.Categorical.from_codes(getattr(t, name), kind.words())
        else:
            out[name] = getattr(t, name)
    return out


def _sharding_labels(t: LayoutTable) -> pd.Categorical:
    """Each row's :meth:`Sharding.describe` ('zero0'..'zero3' or AMSP's placements)."""
    cols = [c for c in t.columns() if c.endswith(("_kind", "_group"))]
    if not len(t):
        return pd.Categorical([])
    codes = np.stack([getattr(t, c) for c in cols], 1)
    uniq, inverse = np.unique(codes, axis=0, return_inverse=True)
    first = [int(np.flatnonzero(inverse.ravel() == j)[0]) for j in range(len(uniq))]
    labels = [t.sharding(i).describe() for i in first]
    return pd.Categorical.from_codes(inverse.ravel(), labels)


def check_space_fp8(system: SystemSpec, space) -> None:
    """Refuse an fp8 plan in one line where the system, a recipe or an engine of the space
    cannot run it (costmodel/fp8.py check_fp8): MI250X and A100 have no FP8 tensor cores."""
    if space.dtype != "fp8":
        return
    recipes = space.fp8_recipe or layout_field_search("fp8_recipe")
    # DeepSpeed's layouts are rejected row by row (its rule: no fp8 dtype); the other engines
    # must run every recipe asked for, which the planner does not check row by row.
    engines = [e for e in space.engine or layout_field_search("engine") if e != "deepspeed"]
    for recipe in recipes:
        check_fp8(system, space.dtype, recipe)
        for engine in engines:
            check_fp8(system, space.dtype, recipe, engine)


def in_dtype(model: ModelSpec, system: SystemSpec, layouts: LayoutTable, dtype: str,
             eager: bool = False, overlap_comm: bool = True,
             cp_exchange: str | None = None, p2p_overlap: bool = False,
             tp_comm_overlap: bool = False, moe_run: MoeRun = NO_OVERLAP
             ) -> dict[str, np.ndarray]:
    """The cost model's figures for the same layouts trained in ``dtype`` (``flm plan
    --fp8-speedup``: an fp8 plan's layouts in bf16, or a bf16 plan's in fp8), with the plan's
    ``cp_exchange``, ``p2p_overlap``, ``tp_comm_overlap`` and ``moe_run`` (:func:`plan`), so
    both precisions are the same run."""
    if dtype == "fp8":
        check_fp8(system, dtype)
    cols = layouts.columns()
    cols["dtype"] = np.full(len(layouts), DType(dtype).code, dtype=cols["dtype"].dtype)
    return evaluate(model, system, LayoutTable(**cols), eager, overlap_comm,
                    tp_comm_overlap=tp_comm_overlap, moe_run=moe_run, p2p_overlap=p2p_overlap,
                    cp_exchange=cp_exchange)


def layout_field_search(name: str) -> tuple:
    """The values a space that leaves ``name`` open searches (its field's ``search``)."""
    field_ = next(f for f in layout_fields() if f.name == name)
    return tuple(field_.metadata.get("search") or ())


def plan(model: ModelSpec, system: SystemSpec, gpus: int, global_batch: int | None = None,
         space: SearchSpace | None = None, eager: bool = False,
         overlap_comm: bool = True, reduce_fp32: bool | None = None,
         tp_comm_overlap: bool = False, moe_run: MoeRun = NO_OVERLAP,
         grad_sync: bool | None = None, fp8_params: bool | None = None,
         p2p_overlap: bool = False, cp_exchange: str | None = None,
         cp_heads: int | None = None) -> Plan:
    """Evaluate every layout of ``space`` for ``model`` on ``gpus`` GPUs of ``system``;
    ``eager``: element-wise work as un-compiled PyTorch runs it (``flm plan --eager``;
    calibration's rows whose model code is plain PyTorch); Megatron-LM layouts stay fused.
    ``overlap_comm`` False: DeepSpeed's ZeRO-1/2 layouts as a ds_config without
    ``overlap_comm`` runs them (``flm plan --deepspeed-overlap-comm off``; calibration's
    Megatron-DeepSpeed rows); flm's own DeepSpeed config sets it. ``reduce_fp32`` (None: each
    engine's rule): gradients reduced in fp32 or in the training dtype (calibration's
    fms-fsdp rows, whose FSDP policy reduces in bf16). ``tp_comm_overlap``: Megatron-LM layouts
    run with ``--tp-comm-overlap`` (``flm plan --tp-comm-overlap on``; calibration's rows that
    state it); off by default, as flm's Megatron-LM command runs them. ``moe_run``: how an
    MoE run dispatches and overlaps its all-to-alls (``flm plan --moe-overlap
    --moe-dispatcher``; costmodel/moe.py MoeRun), by default none overlapped. ``grad_sync``
    (None: each engine's rule): FSDP2 reduce-scatters after every micro-batch (torchtitan's
    accumulation; calibration's torchtitan rows) or only after the last (flm bench).
    ``fp8_params`` (None: where flm's export writes ``--fp8-param-gather``): Megatron FP8
    weights held as FP8 parameters (calibration's rows that state it). ``p2p_overlap``: an
    interleaved Megatron schedule's pipeline sends overlapped with compute (``flm plan
    --overlap-p2p-comm on``; calibration's rows whose configs state ``overlap_p2p_comm``); off
    by default, every send exposed, as flm's Megatron-LM command runs them
    (``--no-overlap-p2p-communication``); other layouts are unchanged by it. ``cp_exchange``
    (None: the engine's rule, flm bench's single gather): the native engine's context
    parallelism as flm bench runs it ("gather") or as PyTorch's ``context_parallel`` ring
    ("ring", torchtitan; ``flm plan --cp-exchange ring``; calibration's rows that state it).
    ``cp_heads`` (None: the model's kv heads, as flm's torchtitan runs it): the K/V heads SDPA
    receives, saved by its kernel and exchanged by a ring (calibration's rows whose torchtitan
    repeats K/V before SDPA; costmodel.evaluate)."""
    if not 1 <= gpus <= MAX_GPUS:
        raise UserError(f"the GPU count must be between 1 and {MAX_GPUS:,} (got {gpus})")
    gb = global_batch or default_global_batch(model, gpus)
    space = space or SearchSpace()
    if moe_run.overlap == "dualpipe" and space.engine is None:
        # The open engine list is the native engine alone (specs/space.py), which has no
        # DualPipe: a DualPipe run's open list is the engines that state it.
        space = dataclasses.replace(space, engine=tuple(e.value for e in DUALPIPE_ENGINES))
    check_space_fp8(system, space)
    layouts, reason = enumerate_layouts(model, system, gpus, gb, space)
    if moe_run.overlap == "dualpipe":
        # DualPipe replaces the schedule: one label, an even pp, the engines that state it.
        reason = dualpipe_reasons(reason, layouts)
    # The cost model runs on the layouts no rule rejected; the others get NaN figures.
    ok = np.flatnonzero(reason == 0)
    sub = evaluate(model, system, layouts.take(ok), eager, overlap_comm, reduce_fp32,
                   tp_comm_overlap, moe_run, grad_sync, fp8_params, p2p_overlap, cp_exchange,
                   cp_heads)
    # Every row gets every figure: NaN (False) where a rule rejected it. One block for the
    # float figures, each row written once (the tables run to millions of rows).
    floats = [k for k, v in sub.items() if v.dtype != bool]
    rejected = np.flatnonzero(reason != 0)
    block = np.empty((len(floats), len(reason)))
    figures = {}
    for k, row in zip(floats, block, strict=True):
        row[ok] = sub[k]
        row[rejected] = np.nan
        figures[k] = row
    for key, values in sub.items():
        if values.dtype == bool:
            figures[key] = np.zeros(len(reason), dtype=bool)
            figures[key][ok] = values
    # The verdict (docs/planner.md, "Will it fit?"): a layout is rejected only when even the
    # low end of its memory interval exceeds the device (``exceeds``); one whose interval
    # straddles the capacity is ``tight``: kept, ranked after every layout that fits (those
    # whose point estimate is within the device first: Plan.memory_group).
    low, high = memory_bounds(sub["peak_memory_bytes"])
    exceeds = low > system.memory_bytes
    figures["memory_tight"] = np.zeros(len(reason), dtype=bool)
    figures["memory_tight"][ok] = ~exceeds & (high > system.memory_bytes)
    reason[ok[exceeds]] = OOM
    return Plan(model, system, gpus, gb, layouts, figures, reason)


def memory_bounds(peak: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The low and high ends of the peak-memory interval (planner/intervals.py's width: the
    calibration rows that state a measured peak)."""
    q = memory_width().q
    peak = np.asarray(peak, dtype=float)
    return peak * np.exp(-q), peak * np.exp(q)
