"""The Python API: what the ``flm`` commands answer, as DataFrames, dicts and figures.

    import frontier_llm as flm

    ranked = flm.plan("gpt-175b", "frontier", 1024)            # flm plan --json's layouts
    one = flm.predict("gpt-175b", "frontier", tp=8, pp=16, dp=8, global_batch=1024)
    curve = flm.allocation("gpt-1t", "frontier", tokens=20e12, deadline_days=120)
    runs = flm.runs("sqlite:///runs/flm.db", sweep="tiny-weak")  # or a folder of traces
    fig = flm.plot_scaling(flm.scaling_table(runs))

Every function is a thin wrapper over what the command line calls (the planner, the cost model,
the store's queries, the report's tables and figures, the exporters), so a notebook and
``flm ... --json`` give the same numbers; tests/test_api.py holds them to it. The names listed in
``__all__`` are the stable surface (docs/api.md); everything else in the package may move.

Importing ``frontier_llm`` imports none of this: the package resolves these names on first use,
and nothing here imports torch (only ``flm bench`` needs it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frontier_llm.errors import UserError

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from frontier_llm.specs.layout import Layout
    from frontier_llm.specs.model import ModelSpec
    from frontier_llm.specs.system import SystemSpec

__all__ = [
    "allocation",
    "error_table",
    "explain",
    "export_layout",
    "layout",
    "layouts_table",
    "load_model",
    "load_system",
    "plan",
    "plan_memory",
    "plot_allocation",
    "plot_errors",
    "plot_layouts",
    "plot_memory",
    "plot_scaling",
    "predict",
    "runs",
    "save_figure",
    "scaling_table",
    "validation",
]


# --- models, systems, layouts ----------------------------------------------------------------

def load_model(model: str | ModelSpec, seq_len: int | None = None) -> ModelSpec:
    """A model of the catalog by name (``flm models`` lists them) or a YAML file's path; a
    :class:`~frontier_llm.specs.model.ModelSpec` passes through. ``seq_len`` overrides the
    sequence length (a long-context stage of the same model), as ``--seq-len`` does."""
    from frontier_llm.catalog import load_model as catalog_model
    from frontier_llm.specs.model import ModelSpec

    _check_numbers(seq_len=seq_len)
    if not isinstance(model, ModelSpec | str | Path):
        raise UserError(f"model must be a name, a YAML file's path or a ModelSpec (got "
                        f"{type(model).__name__})")
    spec = model if isinstance(model, ModelSpec) else catalog_model(str(model))
    return dataclasses.replace(spec, seq_len=seq_len) if seq_len else spec


def load_system(system: str | SystemSpec) -> SystemSpec:
    """A system of the catalog by name (``flm systems`` lists them) or a YAML file's path; a
    :class:`~frontier_llm.specs.system.SystemSpec` passes through."""
    from frontier_llm.catalog import load_system as catalog_system
    from frontier_llm.specs.system import SystemSpec

    if not isinstance(system, SystemSpec | str | Path):
        raise UserError(f"system must be a name, a YAML file's path or a SystemSpec (got "
                        f"{type(system).__name__})")
    return system if isinstance(system, SystemSpec) else catalog_system(str(system))


def layout(**fields: Any) -> Layout:
    """A validated :class:`~frontier_llm.specs.layout.Layout` from the same fields as
    ``flm predict``'s layout flags (``tp=8, pp=16, dp=8, micro_batch=1, global_batch=1024,
    zero=1, recompute="selective"``, ...); what is left out gets the flags' defaults (bf16, a
    global batch of micro_batch x dp). A broken rule raises
    :class:`~frontier_llm.errors.SpecError` naming it."""
    return _layout(fields)


def _layout(fields: dict[str, Any]) -> Layout:
    from frontier_llm.specs.layout import Layout, complete_layout

    values = {k: v for k, v in fields.items() if v is not None}
    values.setdefault("dtype", "bf16")  # flm predict's default precision
    return Layout.from_dict(complete_layout(values))


# --- plan and predict (flm plan, flm predict) ------------------------------------------------

def _check_numbers(**given: Any) -> None:
    """Each number of a call checked as its flm plan flag is: NaN, an infinity, a negative, a
    fraction where a count is meant or a value out of range is one line, a UserError naming the
    keyword, never a TypeError or a ValueError from deep inside, nor a NaN budget answered.
    Token budgets and deadlines go through the parsers the flags use (planner.allocation)."""
    from frontier_llm.errors import UserError
    from frontier_llm.planner.allocation import parse_days, parse_tokens
    from frontier_llm.specs.layout import MAX_COUNT, MAX_GPUS
    from frontier_llm.specs.model import MAX_DIMENSION

    counts = {"gpus": MAX_GPUS, "global_batch": MAX_COUNT, "seq_len": MAX_DIMENSION,
              "top": MAX_COUNT}
    for name, value in given.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UserError(f"{name} must be a number (got {type(value).__name__})")
        if name in counts:
            if isinstance(value, float) and not value.is_integer():
                raise UserError(f"{name} must be a whole number (got {value})")
            if not 1 <= value <= counts[name]:
                raise UserError(f"{name} must be between 1 and {counts[name]:,} (got {value})")
        elif name in ("tokens", "deadline_days"):
            parse = parse_tokens if name == "tokens" else parse_days
            try:
                parse(str(value))
            except ValueError as exc:
                raise UserError(f"{name}: {exc}") from None
        elif not math.isfinite(value) or value <= 0:
            raise UserError(f"{name} must be a finite number above 0 (got {value})")


def _confidence(confidence: float | None) -> float:
    """The intervals' confidence: flm plan's and flm predict's default, 0.8, unless given."""
    from frontier_llm.errors import UserError
    from frontier_llm.planner.intervals import DEFAULT_CONFIDENCE

    if confidence is None:
        return DEFAULT_CONFIDENCE
    if not 0.0 < confidence < 1.0:
        raise UserError(f"confidence must be between 0 and 1 (got {confidence})")
    return float(confidence)


def _space(dtype: str, restrict: dict[str, Any]):
    """The planner's SearchSpace from the restrict keywords (one value or a list per knob), as
    flm plan's restrict flags give it; a knob or value the flags would refuse is refused here in
    one line (UserError), not deep in the planner."""
    from frontier_llm.planner import SearchSpace
    from frontier_llm.specs.layout import Sharding, Vocabulary, zero_preset
    from frontier_llm.specs.space import space_knobs

    knobs = space_knobs()
    lists = {k: tuple(v) if isinstance(v, list | tuple) else (v,) for k, v in restrict.items()}
    for name, values in lists.items():
        if name == "zero":
            kind, valid = int, "0, 1, 2, 3"
            ok = all(v in (0, 1, 2, 3) for v in values)
        elif name not in knobs:
            raise UserError(f"unknown restriction {name}= (knobs: zero, "
                            f"{', '.join(knobs)})")
        else:
            kind = knobs[name]
            if kind is bool:
                valid, ok = "True, False", all(isinstance(v, bool) for v in values)
            elif kind is Sharding:
                valid = "Sharding objects or their text, e.g. 'zero1' or 'p=full,g=full,o=full'"
                ok = all(isinstance(v, Sharding | str) for v in values)
                values = tuple(Sharding.parse(v) if isinstance(v, str) else v for v in values)
                lists[name] = values
            elif isinstance(kind, type) and issubclass(kind, Vocabulary):
                valid = ", ".join(kind.words())
                ok = all(str(v) in kind.words() for v in values)
            else:
                valid = "whole numbers of at least 1"
                ok = all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                         for v in values)
        if not ok or not values:
            raise UserError(f"{name}= takes one value or a list of {valid} (got {values!r})")
    if "zero" in lists:
        lists["sharding"] = tuple(zero_preset(z) for z in lists.pop("zero"))
    return SearchSpace(dtype=dtype, **lists)


def _run(local: dict[str, Any]):
    """The RunSettings of a planning call from its own keywords (``locals()``), flm plan's
    run-setting flags by name (planner/run_settings.py). Every name is looked up, so a setting
    the planner gains is a TypeError in each function here until that function takes it (the
    API once lacked --eager, --deepspeed-overlap-comm and, in its curve, every setting); a
    value of the wrong kind is a UserError naming it."""
    from frontier_llm.planner.run_settings import NAMES, RunSettings

    return RunSettings(**{name: local[name] for name in NAMES if name in local})


def _planned(model, system, gpus, global_batch, seq_len, dtype, restrict, run,
             router_balance: str | None):
    from frontier_llm.planner import plan as run_plan

    _check_numbers(gpus=gpus, global_batch=global_batch, seq_len=seq_len)
    m, s = load_model(model, seq_len), load_system(system)
    m = _balanced(m, router_balance)
    return m, s, run_plan(m, s, gpus, global_batch, _space(dtype, restrict), **run.keywords())


def _balanced(m, router_balance: str | None):
    """The model with ``router_balance`` applied (``--router-balance``; a dense model has no
    router)."""
    if router_balance is not None and m.is_moe:
        m = dataclasses.replace(m, router_balance=router_balance)
    return m


def plan(model: str | ModelSpec = "gpt-175b", system: str | SystemSpec = "frontier",
         gpus: int = 1024, *, global_batch: int | None = None, seq_len: int | None = None,
         top: int | None = 20, include_oom: bool = False, all_layouts: bool = False,
         tokens: float | None = None, confidence: float | None = None,
         risk_aware: bool = False, dtype: str = "bf16", moe_overlap: str = "none",
         moe_dispatcher: str = "alltoall", router_balance: str | None = None,
         cp_exchange: str | None = None, p2p_overlap: bool = False,
         tp_comm_overlap: bool = False, eager: bool = False,
         deepspeed_overlap_comm: bool = True, **restrict: Any) -> pd.DataFrame:
    """Rank the layouts of ``model`` on ``gpus`` GPUs (Frontier: GCDs) of ``system``, fastest
    first: the rows ``flm plan --format json`` prints under ``layouts``, with the same columns
    (layout knobs, step time, throughput, MFU, peak memory, fits, their intervals, and with
    ``tokens`` the budget's days, node-hours and energy).

    ``global_batch`` in sequences (default: the smallest multiple of ``gpus`` holding 4M
    tokens); ``top`` rows (None: all); ``include_oom`` also ranks layouts that do not fit;
    ``all_layouts`` keeps dominated layouts (``--all``); ``confidence`` of the intervals
    (default 0.8); ``risk_aware`` ranks by the low end of throughput. ``restrict`` narrows the
    search as flm plan's restrict flags do, one value or a list per knob: ``tp=8``,
    ``pp=[8, 16]``, ``engine="megatron"``, ``zero=[1, 3]``, ``recompute=["none", "full"]``.
    An MoE model's ``moe_overlap`` (none, ep-a2a, dualpipe), ``moe_dispatcher`` (alltoall,
    flex) and ``router_balance`` (aux-loss, aux-loss-global, aux-free, forced; None: the
    model's) are flm plan's ``--moe-overlap``, ``--moe-dispatcher`` and ``--router-balance``.
    ``cp_exchange`` is ``--cp-exchange``: how a native layout's context parallelism runs,
    "gather" (flm bench's; None, the default) or "ring" (PyTorch's context_parallel, as
    torchtitan runs it). ``p2p_overlap`` True: Megatron-LM's interleaved layouts priced with
    their pipeline sends overlapped with compute (``--overlap-p2p-comm on``: Megatron-Core's
    ``overlap_p2p_comm``); the default, False, is the command flm exports
    (``--no-overlap-p2p-communication``); other layouts are unchanged by it.
    ``tp_comm_overlap`` True: Megatron-LM's layouts with tp > 1 priced with their TP
    collectives overlapped with the GEMMs (``--tp-comm-overlap on``: Megatron-LM's
    ``--tp-comm-overlap``, which it runs only with sequence parallelism); the default, False,
    is the command flm exports; other layouts are unchanged by it. ``eager`` True: element-wise
    work priced as un-compiled PyTorch runs it (``--eager``; Megatron-LM layouts stay fused).
    ``deepspeed_overlap_comm`` False: DeepSpeed's ZeRO-1/2 layouts as a ds_config without
    ``overlap_comm`` runs them (``--deepspeed-overlap-comm off``); the default, True, is the
    ds_config flm exports. These are every run setting of flm plan
    (planner/run_settings.py), as are :func:`explain`'s, :func:`plan_memory`'s and
    :func:`allocation`'s keywords of the same names.

    The frame's ``attrs`` hold the rest of the JSON document: ``model``, ``system``, ``gpus``,
    ``global_batch``, ``evaluated`` and ``rejected`` (layouts per broken rule).
    """
    from frontier_llm.planner.annotations import annotate

    run = _run(locals())
    _check_numbers(gpus=gpus, global_batch=global_batch, seq_len=seq_len, top=top,
                   tokens=tokens)
    confidence = _confidence(confidence)
    m, s, result = _planned(model, system, gpus, global_batch, seq_len, dtype, restrict, run,
                            router_balance)
    ranked = result.ranked(None if risk_aware else top, fits_only=not include_oom,
                           frontier=not all_layouts)
    ranked = annotate(ranked, m, s, confidence=confidence, tokens=tokens, risk_aware=risk_aware,
                      top=top)
    ranked.attrs.update(model=m.name, system=s.name, gpus=gpus,
                        global_batch=result.global_batch, evaluated=len(result.reason),
                        interval_confidence=confidence, tokens=tokens,
                        rejected=result.rejections())
    return ranked


def explain(model: str | ModelSpec = "gpt-175b", system: str | SystemSpec = "frontier",
            gpus: int = 1024, *, global_batch: int | None = None, seq_len: int | None = None,
            dtype: str = "bf16", moe_overlap: str = "none", moe_dispatcher: str = "alltoall",
            router_balance: str | None = None, cp_exchange: str | None = None,
            p2p_overlap: bool = False, tp_comm_overlap: bool = False, eager: bool = False,
            deepspeed_overlap_comm: bool = True, **restrict: Any) -> str:
    """Why the planner's winner wins: what the fastest layout with a different choice of each
    knob would cost, and how many layouts each rule rejected (``flm plan --explain``). The run
    settings are :func:`plan`'s."""
    from frontier_llm.planner.explain import explain as why

    run = _run(locals())
    return why(_planned(model, system, gpus, global_batch, seq_len, dtype, restrict, run,
                        router_balance)[2])


def plan_memory(model: str | ModelSpec = "gpt-175b", system: str | SystemSpec = "frontier",
                gpus: int = 1024, *, top: int = 5, global_batch: int | None = None,
                seq_len: int | None = None, dtype: str = "bf16", moe_overlap: str = "none",
                moe_dispatcher: str = "alltoall", router_balance: str | None = None,
                cp_exchange: str | None = None, p2p_overlap: bool = False,
                tp_comm_overlap: bool = False, eager: bool = False,
                deepspeed_overlap_comm: bool = True, **restrict: Any) -> pd.DataFrame:
    """Predicted memory per GPU, by part (GB: params, grads, optimizer, activations, loss,
    buffers, reserved), of the planner's ``top`` fastest layouts that fit, fastest first, with
    the device's capacity: the table :func:`plot_memory` draws. The run settings are
    :func:`plan`'s."""
    from frontier_llm.report import memory_breakdown
    from frontier_llm.report.frames import plan_rows

    run = _run(locals())
    _check_numbers(top=top)
    result = _planned(model, system, gpus, global_batch, seq_len, dtype, restrict, run,
                      router_balance)[2]
    return memory_breakdown(plan_rows(result, top=top))


def allocation(model: str | ModelSpec, system: str | SystemSpec = "frontier", *,
               tokens: float | None = None, gpus: tuple[int, int] | None = None,
               deadline_days: float | None = None, max_node_hours: float | None = None,
               global_batch: int | None = None, seq_len: int | None = None,
               confidence: float | None = None, risk_aware: bool = False, dtype: str = "bf16",
               grow_batch: bool = False, moe_overlap: str = "none",
               moe_dispatcher: str = "alltoall", router_balance: str | None = None,
               cp_exchange: str | None = None, p2p_overlap: bool = False,
               tp_comm_overlap: bool = False, eager: bool = False,
               deepspeed_overlap_comm: bool = True, **restrict: Any) -> pd.DataFrame:
    """The planner's best layout at each power-of-two GPU count from ``gpus = (lo, hi)``
    (default: one node's GPUs to 65,536), with its step-time interval and, with ``tokens``,
    days to train, node-hours, GPU-hours and energy with their intervals: the ``curve`` of
    ``flm plan --curve --format json`` (``--tokens``, ``--deadline``, ``--max-node-hours``).

    ``deadline_days`` (or ``max_node_hours``, with ``tokens``) also picks the count that meets
    it for the fewest node-hours (the fastest within the budget), judged on the intervals'
    high end as flm plan judges it. Every count trains the same global batch (``global_batch``
    or 4M tokens) unless ``grow_batch`` lets it grow with the count (``--grow-batch``); the
    batch and what the answer rests on are in ``attrs["batch"]`` and ``attrs["rests_on"]``.
    ``risk_aware`` is refused (each count's best is by its point estimate; :func:`plan` ranks
    one count by the low end of the throughput interval). The choice is in
    ``attrs["selection"]``: ``message`` (the sentence flm plan prints) and ``gpus`` (None when
    no count qualifies). The run settings are :func:`plan`'s, as ``flm plan --curve`` takes
    them.
    """
    from frontier_llm.errors import UserError
    from frontier_llm.planner import allocation as alloc
    from frontier_llm.planner.annotations import allocation_refusal, curve_counts
    from frontier_llm.specs.layout import MAX_GPUS

    run = _run(locals())
    _check_numbers(tokens=tokens, deadline_days=deadline_days, max_node_hours=max_node_hours,
                   global_batch=global_batch, seq_len=seq_len)
    if gpus is not None:
        if not isinstance(gpus, tuple | list) or len(gpus) != 2:
            raise UserError("gpus must be a (lowest, highest) pair of GPU counts")
        _check_numbers(gpus=gpus[0])
        _check_numbers(gpus=gpus[1])
    confidence = _confidence(confidence)
    if gpus is not None and not 1 <= gpus[0] <= gpus[1] <= MAX_GPUS:
        raise UserError(f"gpus needs 1 <= lo <= hi <= {MAX_GPUS:,} (got {gpus})")
    refused = allocation_refusal(
        tokens=tokens, deadline_days=deadline_days, max_node_hours=max_node_hours,
        global_batch=global_batch, grow_batch=grow_batch, curve=True, risk_aware=risk_aware,
        names={k: k for k in ("tokens", "deadline_days", "max_node_hours", "global_batch",
                              "grow_batch", "risk_aware")} | {"curve": "allocation",
                                                "one_count": "plan(gpus=N, risk_aware=True)"})
    if refused:
        raise UserError(refused)
    m, s = load_model(model, seq_len), load_system(system)
    m = _balanced(m, router_balance)
    cur = alloc.allocation_curve(m, s, curve_counts(s, gpus), tokens, confidence,
                                 _space(dtype, restrict), global_batch=global_batch,
                                 grow_batch=grow_batch, **run.keywords())
    selection = None
    if deadline_days is not None:
        selection = alloc.select_deadline(cur, deadline_days)
    elif max_node_hours is not None:
        selection = alloc.select_budget(cur, max_node_hours)
    cur.attrs.update(model=m.name, system=s.name, tokens=tokens,
                     interval_confidence=confidence,
                     batch=alloc.batch_note(cur, m.seq_len, grow_batch),
                     rests_on=alloc.rests_on(s))
    if selection is not None:
        cur.attrs["selection"] = {
            "message": selection.message,
            "gpus": None if selection.row is None else int(selection.row["gpus"])}
    return cur


def predict(model: str | ModelSpec, system: str | SystemSpec, layout: Layout | None = None, *,
            seq_len: int | None = None, tokens: float | None = None,
            confidence: float | None = None, moe_overlap: str = "none",
            moe_dispatcher: str = "alltoall", router_balance: str | None = None,
            cp_exchange: str | None = None, p2p_overlap: bool = False,
            tp_comm_overlap: bool = False, **fields: Any) -> dict[str, Any]:
    """One layout's predicted step time (with its breakdown), throughput, MFU/HFU, per-rank
    peak memory (with its breakdown), whether it fits, and the intervals: the document
    ``flm predict --format json`` prints (with ``tokens``: steps, days, node-hours, energy).

    The layout is ``layout`` or the fields of :func:`layout` (``tp=8, pp=16, dp=8, ...``).
    ``moe_overlap``, ``moe_dispatcher``, ``router_balance``, ``cp_exchange``,
    ``p2p_overlap``, ``tp_comm_overlap``: the run's settings, as in :func:`plan`
    (``--cp-exchange``, ``--overlap-p2p-comm``, ``--tp-comm-overlap``); ``p2p_overlap`` True
    on a layout it does not act on (not Megatron's interleaved schedule) raises UserError, as
    flm predict refuses it, and so does ``tp_comm_overlap`` True on a layout Megatron-LM
    would not run it on (not engine megatron with sequence parallelism).
    """
    from frontier_llm.costmodel import predict as cost
    from frontier_llm.planner.annotations import predict_extras
    from frontier_llm.planner.run_settings import DEFAULTS as RUN_DEFAULTS

    _check_numbers(seq_len=seq_len, tokens=tokens, confidence=confidence)
    if layout is None:
        layout = _layout(fields)
    elif fields:
        raise UserError("give a Layout or its fields, not both")
    # flm predict has no --eager or --deepspeed-overlap-comm: those two at flm plan's defaults.
    run = _run({**dataclasses.asdict(RUN_DEFAULTS), **locals()})
    m = _balanced(load_model(model, seq_len), router_balance)
    s = load_system(system)
    out = {"model": m.name, "system": s.name, "layout": layout.to_dict(),
           **cost(m, s, layout, moe_run=run.moe_run(), cp_exchange=run.cp_exchange,
                  p2p_overlap=run.p2p_overlap, tp_comm_overlap=run.tp_comm_overlap)}
    out.update(predict_extras(out, layout, m, s, confidence=_confidence(confidence),
                              tokens=tokens))
    return out


def export_layout(trainer: str, model: str | ModelSpec, layout: Layout,
                  system: str | SystemSpec | None = None, *,
                  p2p_overlap: bool = False, tp_comm_overlap: bool = False) -> str:
    """``layout`` as another trainer's configuration text: ``megatron-lm`` and
    ``megatron-deepspeed`` flags, a ``torchtitan`` TOML job file or a ``deepspeed`` ds_config
    JSON (``flm export --to TRAINER``; docs/export.md). A layout the trainer cannot express is
    refused with :class:`~frontier_llm.export.ExportRefused` naming why. ``p2p_overlap``: the
    run :func:`predict` priced with it (``--overlap-p2p-comm``); Megatron-LM's interleaved
    layouts get ``--no-overlap-p2p-communication`` without it, so the run is the one priced.
    ``tp_comm_overlap``: the run priced with ``--tp-comm-overlap``; Megatron-LM's command then
    carries ``--tp-comm-overlap`` (a layout without sequence parallelism is refused, as
    Megatron-LM asserts), and every other trainer refuses it."""
    from frontier_llm.export import export
    from frontier_llm.planner.run_settings import switch

    return export(trainer, load_model(model), layout,
                  None if system is None else load_system(system),
                  p2p_overlap=switch("p2p_overlap", p2p_overlap),
                  tp_comm_overlap=switch("tp_comm_overlap", tp_comm_overlap))


# --- measured runs (flm collect, flm results, flm validate) ----------------------------------

def _is_url(source: str) -> bool:
    return "://" in source


@contextlib.contextmanager
def _store(source: str | Path | None) -> Iterator[Any]:
    """An open store on a database URL (None: $FLM_DB, else flm.db, as the commands do), or a
    scratch SQLite database holding the traces of a folder (or one trace file). The folder is
    only read: the scratch database collects links to its traces, so a trace it refuses has its
    link set aside, never the file (the refusal is a warning)."""
    from frontier_llm.store import open_existing, open_store
    from frontier_llm.store.ingest import collect, find_traces

    if source is None or _is_url(str(source)):
        store = open_existing(None if source is None else str(source))
        try:
            yield store
        finally:
            store.close()
        return
    with tempfile.TemporaryDirectory(prefix="flm-api-") as tmp:
        links = Path(tmp, "traces")
        links.mkdir()
        found = {}
        for i, (path, _) in enumerate(find_traces([source])):
            link = links / f"{i:07d}-{path.name}"
            link.symlink_to(path.resolve())
            found[str(link)] = str(path)
        store = open_store(f"sqlite:///{tmp}/runs.db")
        try:
            report = collect(store, [links], quarantine=Path(tmp, "refused"))
            # collect leaves a refused link where it is and says so: the refusal, in the
            # folder's own names.
            for text in report.warnings + [reason for _, reason in report.quarantined]:
                for link, path in found.items():
                    text = text.replace(link, path)
                text = text.split("; a symbolic link")[0]
                warnings.warn(f"trace not read: {text}", stacklevel=4)
            yield store
        finally:
            store.close()


def runs(source: str | Path | None = None, sweep: str | None = None) -> pd.DataFrame:
    """One row per run: its layout, status, measurements (step time and its spread, throughput,
    MFU, peak memory) and the cost model's prediction for it (``predicted_*``): the rows of
    ``flm results --format json`` (which also lists sweep job attempts that left no trace) and
    what ``flm report`` reads.

    ``source``: a database URL (``sqlite:///runs/flm.db``, ``postgresql://...``; None:
    ``$FLM_DB``) or a folder of ``*.trace.json`` files (or one file), read without a database
    and without changing the folder. ``sweep``: only that sweep's runs.
    """
    from frontier_llm.store.queries import runs_frame

    with _store(source) as store:
        return runs_frame(store, sweep=sweep)


def validation(source: str | Path | None = None, sweep: str | None = None) -> pd.DataFrame:
    """Predicted against measured, one row per completed run that has a prediction, with the
    signed errors in percent (``flm validate --format json``'s rows): the input of
    :func:`error_table` and :func:`plot_errors`. ``source`` and ``sweep`` as for :func:`runs`."""
    from frontier_llm.store.queries import validation_frame

    with _store(source) as store:
        return validation_frame(store, sweep=sweep)


# --- report tables and figures (flm report) --------------------------------------------------

def scaling_table(runs: pd.DataFrame, source: str = "measured", mode: str = "auto"
                  ) -> pd.DataFrame:
    """Weak- or strong-scaling efficiency of the runs of :func:`runs`: one row per recipe and
    GPU count, the median step time and its spread, throughput per GPU, the efficiency against
    the smallest count (``flm report scaling``'s CSV). ``source``: ``measured``, ``predicted``
    or ``both``; ``mode``: ``weak``, ``strong`` or ``auto`` (from the global batches)."""
    from frontier_llm.report import scaling_table as table

    return table(runs, source=source, mode=mode)


def layouts_table(frame: pd.DataFrame, require_measured: bool = True) -> pd.DataFrame:
    """One row per layout of :func:`runs`' frame: runs and their status, median throughput per
    GPU and its spread, peak memory, the predictions and their errors, fastest first (``flm
    report layouts``' CSV): the input of :func:`plot_layouts`."""
    from frontier_llm.report import layouts_table as table

    return table(frame, require_measured=require_measured)


def error_table(validation: pd.DataFrame, overall: bool = True) -> pd.DataFrame:
    """Per system and engine: runs compared, step-time and memory MAPE, bias and largest
    error, and the rank correlation of throughput (``flm report errors``' CSV); ``overall``
    adds a row pooling every group. ``validation`` is :func:`validation`'s frame."""
    from frontier_llm.report import errors_table

    return errors_table(validation, overall=overall)


def plot_scaling(table: pd.DataFrame, gpu_label: str = "GPUs", title: str | None = None
                 ) -> Figure:
    """The scaling figure of ``flm report scaling``: per series, throughput per GPU (weak) or
    step time (strong) with the ideal line, and the efficiency, measured and predicted."""
    from frontier_llm.report.figures import plot_scaling as draw

    return draw(table, gpu_label=gpu_label, title=title)


def plot_layouts(table: pd.DataFrame, title: str | None = None, per: str = "GPU",
                 log: bool = False) -> Figure:
    """Throughput and peak memory per layout, measured beside predicted (``flm report
    layouts``); ``table`` is :func:`layouts_table`'s frame."""
    from frontier_llm.report.figures import plot_layouts as draw

    return draw(table, title=title, per=per, log=log)


def plot_errors(validation: pd.DataFrame, title: str | None = None) -> Figure:
    """Predicted against measured step time and peak memory, per system and engine, with the
    y = x line and a +-20 % band (``flm report errors``)."""
    from frontier_llm.report.figures import plot_errors as draw

    return draw(validation, title=title)


def plot_memory(breakdown: pd.DataFrame, title: str | None = None) -> Figure:
    """Memory per GPU stacked by part for each layout of :func:`plan_memory` (or a layouts
    report's breakdown), against the device's capacity."""
    from frontier_llm.report.figures import plot_memory_breakdown as draw

    return draw(breakdown, title=title)


def plot_allocation(curve: pd.DataFrame, deadline_days: float | None = None,
                    gpu_label: str = "GPUs", title: str | None = None) -> Figure:
    """Days to train and node-hours against the GPU count with their interval bands, the
    deadline and the count :func:`allocation` selected (``flm report plan``). Without a
    ``title``, the curve's model, system and token budget are the title."""
    from frontier_llm.report.allocation import format_tokens
    from frontier_llm.report.allocation import plot_allocation as draw

    chosen = (curve.attrs.get("selection") or {}).get("gpus")
    if title is None and "model" in curve.attrs:
        tokens = curve.attrs.get("tokens")
        budget = f": {format_tokens(tokens)} tokens" if tokens else ""
        title = f"{curve.attrs['model']} on {curve.attrs['system']}{budget}"
    return draw(curve, deadline_days=deadline_days, selected_gpus=chosen, gpu_label=gpu_label,
                title=title)


def save_figure(fig: Figure, out_dir: str | Path, name: str) -> Sequence[Path]:
    """Write ``name``.png and ``name``.pdf into ``out_dir`` (made if missing), as the reports
    do, and close the figure; returns both paths."""
    from frontier_llm.report.style import save

    return save(fig, out_dir, name)
