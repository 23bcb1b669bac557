"""flm plan's allocation flags: a token budget, error bars, the scaling curve, a deadline or a
node-hour budget, the smallest machine that fits, risk-aware ranking (docs/planner.md,
"Planning an allocation"). The arithmetic lives in planner/allocation.py and
planner/intervals.py, the annotations and refusals in planner/annotations.py (typed, shared
with the Python API); this module reads flags and prints."""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from frontier_llm.cli.common import emit_frame, emit_json
from frontier_llm.cli.numbers import MAX_GPUS, count, days, fraction, positive_float, tokens
from frontier_llm.cli.overlap_args import (
    add_p2p_overlap,
    add_tp_overlap,
    p2p_overlap_from_args,
    tp_overlap_from_args,
)
from frontier_llm.cli.progress import Progress
from frontier_llm.cli.run_settings import run_settings
from frontier_llm.planner import SearchSpace, annotations, plan
from frontier_llm.planner import allocation as alloc
from frontier_llm.planner.annotations import DEFAULT_CURVE
from frontier_llm.planner.intervals import DEFAULT_CONFIDENCE
from frontier_llm.planner.space import knob_values
from frontier_llm.specs.forms import display_layouts
from frontier_llm.specs.layout import layout_types
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec

# The shortest deadline: an hour. A training run shorter than that is no allocation to plan,
# and 1e-300h asked for a GPU count of 300 digits.
MIN_DEADLINE_DAYS = 1 / 24


def deadline(text: str) -> float:
    """--deadline: a duration with its unit (45d, 12w, 36h), at least an hour, in days. A bare
    number is refused: ``--deadline 45`` read as days was silently 45 days to someone who meant
    hours."""
    stripped = str(text).strip()
    if stripped and (stripped[-1].isdigit() or stripped[-1] == "."):
        raise argparse.ArgumentTypeError(
            f"give the unit: {stripped}d (days), {stripped}h (hours) or {stripped}w (weeks)")
    value = days(text)
    if value < MIN_DEADLINE_DAYS:
        raise argparse.ArgumentTypeError(f"must be at least 1h (got {text})")
    return value

def curve_range(text: str) -> str:
    """``auto`` or ``LO-HI`` (argparse type; checked again when the system is known)."""
    if text == DEFAULT_CURVE:
        return text
    parts = text.split("-")
    try:
        lo, hi = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--curve takes LO-HI GPU counts, e.g. 8-65536 (got {text!r})"
        ) from None
    if not 1 <= lo <= hi <= MAX_GPUS:
        raise argparse.ArgumentTypeError(
            f"--curve needs 1 <= LO <= HI <= {MAX_GPUS:,} (got {text})"
        )
    return text


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register the allocation flags on ``flm plan``."""
    g = p.add_argument_group("plan an allocation (docs/planner.md, 'Planning an allocation')")
    g.add_argument(
        "--tokens",
        type=tokens,
        default=None,
        metavar="T",
        help="token budget, e.g. 2e13, 20T, 300B: adds steps, days, node-hours, "
        "GPU-hours and energy (kWh, from the system's power: key) with their "
        "intervals",
    )
    g.add_argument(
        "--confidence",
        type=fraction,
        default=DEFAULT_CONFIDENCE,
        metavar="C",
        help="confidence of the intervals every prediction carries (default "
        f"{DEFAULT_CONFIDENCE}); their width is the model's measured "
        "out-of-sample error on the calibration runs",
    )
    g.add_argument(
        "--curve",
        nargs="?",
        const=DEFAULT_CURVE,
        default=None,
        type=curve_range,
        metavar="LO-HI",
        help="the best layout at every power-of-two GPU count from LO to HI "
        "(default: one node's GPUs to 65,536) instead of the layouts at --gpus; "
        "every count trains the same global batch: --global-batch, or the default "
        "at the largest count (4M tokens in whole sequences)",
    )
    g.add_argument(
        "--grow-batch",
        action="store_true",
        help="with --curve: let the global batch grow with the GPU count (the smallest "
        "multiple of each count holding 4M tokens: weak scaling) instead of keeping "
        "it fixed; more tokens a step shorten training only below the critical batch "
        "size (McCandlish et al. 2018; Kaplan et al. 2020), which the plan does not model",
    )
    g.add_argument(
        "--deadline",
        type=deadline,
        default=None,
        metavar="D",
        help="with --tokens: the GPU count (and layout) that trains within D "
        "(45d, 12w, 36h: the unit is required; at least 1h) for the fewest node-hours, "
        "judged on the high end of the days' interval (the point estimate is shown beside "
        "it); implies --curve",
    )
    g.add_argument(
        "--max-node-hours",
        type=positive_float(1e12),
        default=None,
        metavar="N",
        help="with --tokens: the fastest GPU count within N node-hours, judged on the "
        "high end of the node-hours' interval; implies --curve",
    )
    g.add_argument(
        "--min-gpus",
        action="store_true",
        help="per engine: the smallest power-of-two GPU count with a layout "
        "predicted to fit, and the largest micro-batch that fits there and at "
        "--gpus",
    )
    g.add_argument(
        "--risk-aware",
        action="store_true",
        help="rank by the pessimistic (low) end of the throughput interval and "
        "mark layouts whose memory interval straddles the device's capacity "
        "('tight'); with one engine the order is unchanged, since an engine's "
        "width is the same for all its layouts (--deadline and --max-node-hours "
        "always judge by the pessimistic, high end of days and node-hours)",
    )


def wants_curve(args: argparse.Namespace) -> bool:
    return bool(args.curve or args.deadline is not None or args.max_node_hours is not None)


def check(args: argparse.Namespace) -> str | None:
    """A one-line refusal for flag combinations that cannot be answered, else None."""
    return annotations.allocation_refusal(
        tokens=args.tokens, deadline_days=args.deadline, max_node_hours=args.max_node_hours,
        global_batch=args.global_batch, grow_batch=getattr(args, "grow_batch", False),
        curve=bool(args.curve), risk_aware=bool(getattr(args, "risk_aware", False)))


def annotate(
    frame: pd.DataFrame,
    model: ModelSpec,
    system: SystemSpec,
    args: argparse.Namespace,
    top: int | None = None,
) -> pd.DataFrame:
    """planner.annotations.annotate with the flags' values (--confidence, --tokens,
    --risk-aware)."""
    return annotations.annotate(frame, model, system, confidence=args.confidence,
                                tokens=args.tokens, risk_aware=getattr(args, "risk_aware", False),
                                top=top)


def _num(x: float) -> str:
    """Three significant figures below 1,000, whole numbers with separators above."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _range(lo: pd.Series, hi: pd.Series) -> list[str]:
    return [
        f"{_num(a)}-{_num(b)}" if np.isfinite(a) and np.isfinite(b) else ""
        for a, b in zip(lo, hi, strict=True)
    ]


def display_columns(
    shown: pd.DataFrame, full: pd.DataFrame, args: argparse.Namespace
) -> pd.DataFrame:
    """The table's extra columns: the step-time interval, the memory verdict, and with
    --tokens days, node-hours and MWh with their intervals."""
    if not len(full) or "step_time_s_low" not in full:
        return shown
    shown = shown.copy()
    pct = f"{args.confidence:.0%}"
    shown[f"step_s {pct}"] = _range(full["step_time_s_low"], full["step_time_s_high"])
    shown["mem"] = full["memory_verdict"].to_numpy()
    if args.tokens is not None:
        shown["days"] = [_num(x) for x in full["train_days"]]
        shown[f"days {pct}"] = _range(full["train_days_low"], full["train_days_high"])
        shown["node_h"] = [_num(x) for x in full["node_hours"]]
        shown["MWh"] = [_num(x) for x in full["energy_kwh"] / 1e3]
    return shown


def summary_lines(
    model: ModelSpec, system: SystemSpec, frame: pd.DataFrame, args: argparse.Namespace
) -> list[str]:
    """What the intervals and the token budget rest on, for stderr."""
    lines = [f"# {alloc.rests_on(system)}"]
    if len(frame) and "interval_basis" in frame:
        bases = "; ".join(b for b in dict.fromkeys(frame["interval_basis"].astype(str)) if b)
        lines.append(
            f"# intervals at {args.confidence:.0%}: step time from {bases}; memory "
            f"from {frame['memory_interval_basis'].iloc[0]}"
        )
    if args.tokens is not None:
        flops, params = six_nd(model, args.tokens)
        lines.append(f"# {args.tokens:.3g} tokens x {params}: 6ND = {flops:.3g} FLOPs; "
                     f"{alloc.power_note(system)}")
    return lines


def six_nd(model: ModelSpec, tokens: float) -> tuple[float, str]:
    """6·N·D over the parameters a token passes through, and N in words: an MoE model's
    active ones (its top_k and shared experts; the compute the cost model prices), named
    so beside its total."""
    active = model.active_params()
    words = f"{active:.3g} parameters"
    if model.is_moe:
        words = f"{active:.3g} active parameters (of {model.num_params():.3g})"
    return alloc.training_flops(active, tokens), words


def run_curve(
    args: argparse.Namespace, model: ModelSpec, system: SystemSpec, space: SearchSpace
) -> int:
    """--curve / --deadline / --max-node-hours: the best layout at each GPU count."""
    counts = curve_counts(args, system)
    with Progress(f"planning {len(counts)} GPU counts") as bar:
        cur = alloc.allocation_curve(
            model,
            system,
            counts,
            args.tokens,
            args.confidence,
            space,
            on_count=lambda i: bar.update(i, len(counts)),
            global_batch=args.global_batch,
            grow_batch=args.grow_batch,
            **run_settings(args),
        )
    selection = None
    if args.deadline is not None:
        selection = alloc.select_deadline(cur, args.deadline)
    elif args.max_node_hours is not None:
        selection = alloc.select_budget(cur, args.max_node_hours)
    for line in [f"# {alloc.batch_note(cur, model.seq_len, args.grow_batch)}",
                 *summary_lines(model, system, cur, args)]:
        print(line, file=sys.stderr)
    if args.format == "json":
        doc = {
            "model": model.name,
            "system": system.name,
            "tokens": args.tokens,
            "interval_confidence": args.confidence,
            "batch": alloc.batch_note(cur, model.seq_len, args.grow_batch),
            "rests_on": alloc.rests_on(system),
            # NaN (a count where nothing fits) as null: strict JSON for jq and friends.
            "curve": cur.astype(object).where(cur.notna(), None).to_dict(orient="records"),
        }
        if selection is not None:
            doc["selection"] = {
                "message": selection.message,
                "gpus": None if selection.row is None else int(selection.row["gpus"]),
            }
        emit_json(doc)
    elif args.format == "csv":
        emit_frame(cur, "csv")
    else:
        emit_frame(curve_table(cur, args), "table")
    if selection is not None:
        print(
            f"flm plan: {selection.message}",
            file=sys.stdout if args.format == "table" else sys.stderr,
        )
        return 0 if selection.row is not None else 1
    return 0 if curve_has_layout(cur).any() else 1


def curve_has_layout(cur: pd.DataFrame) -> np.ndarray:
    """Per curve row, whether the plan kept a layout at that count (one that fits or a tight
    one: planner.plan's verdict), not only whether its point estimate fits."""
    if "step_time_s" not in cur:
        return np.zeros(len(cur), dtype=bool)
    return cur["step_time_s"].notna().to_numpy()


def curve_counts(args: argparse.Namespace, system: SystemSpec) -> list[int]:
    text = args.curve or DEFAULT_CURVE
    if text == DEFAULT_CURVE:
        return annotations.curve_counts(system)
    lo, hi = (int(p) for p in text.split("-"))
    return annotations.curve_counts(system, (lo, hi))


def curve_table(cur: pd.DataFrame, args: argparse.Namespace) -> pd.DataFrame:
    """The curve as a readable table: one row per GPU count (blank where no layout is kept).
    A count whose best layout is tight (its memory interval straddles the device; the point
    estimate may be over it, so ``fits`` is False) shows that layout, its ``mem`` column
    ``tight``: blank said nothing could run where the plan keeps a layout that may."""
    fits = cur["fits"].astype(bool).to_numpy()
    kept = curve_has_layout(cur)
    if not kept.any():
        return pd.DataFrame({"gpus": cur["gpus"], "fits": fits})
    # The counts without a layout made the layout's integer columns floats: back to counts.
    ok = cur[kept].astype({n: int for n, kind in layout_types().items()
                           if kind is int and n in cur})
    out = pd.DataFrame({"gpus": ok["gpus"].astype(int)})
    if "nodes" in ok:
        out["nodes"] = ok["nodes"].astype(int)
    # The layout columns as every table of layouts shows them (specs.forms): the degrees, cp
    # among them where a row has it, and each other knob that differs or is off its default.
    shown = display_layouts(ok).drop(columns=["global_batch"], errors="ignore")
    out = pd.concat([out, shown.rename(columns={"micro_batch": "mb"})], axis=1)
    # The batch in every row: a curve's days compare counts only at the same tokens a step.
    out["batch"] = ok["global_batch"].astype(int)
    out["batch_tok"] = [alloc.format_tokens(n) for n in ok["batch_tokens"]]
    out["step_s"] = ok["step_time_s"].round(2)
    out = display_columns(out, ok, args)
    out = out.astype(object)
    # Counts without a layout: the GPU count and a blank row.
    missing = pd.DataFrame({"gpus": cur.loc[~kept, "gpus"].astype(int)}).astype(object)
    table = pd.concat([out, missing]).sort_values("gpus", kind="stable")
    if not fits.all():
        table["fits"] = [bool(f) for f in fits[np.argsort(cur["gpus"].to_numpy(), kind="stable")]]
    return table.fillna("").reset_index(drop=True)


def run_min_gpus(
    args: argparse.Namespace, model: ModelSpec, system: SystemSpec, space: SearchSpace
) -> int:
    """--min-gpus: per engine, the smallest power-of-two GPU count with a layout that fits,
    and the largest micro-batch that fits there and at --gpus."""
    from dataclasses import replace

    counts = alloc.power_of_two_counts(1, MAX_GPUS)
    settings = run_settings(args)
    rows = []
    for engine in knob_values(space, "engine"):
        sub = replace(space, engine=(engine,))
        smallest = alloc.min_gpus(
            lambda n, sub=sub: plan(model, system, n, None, sub, **settings),
            counts)
        row = {
            "engine": engine,
            "min_gpus": None,
            "largest_micro_batch_at_min": None,
            "gpus": args.gpus,
            "largest_micro_batch_at_gpus": None,
        }
        if smallest is not None:
            best = alloc.largest_micro_batch(smallest)
            row["min_gpus"] = smallest.gpus
            row["largest_micro_batch_at_min"] = int(best["micro_batch"].iloc[0])
        here = alloc.largest_micro_batch(plan(model, system, args.gpus, args.global_batch, sub,
                                              **settings))
        if len(here):
            row["largest_micro_batch_at_gpus"] = int(here["micro_batch"].iloc[0])
        rows.append(row)
    table = pd.DataFrame(rows)
    if args.format == "json":
        emit_json(
            {
                "model": model.name,
                "system": system.name,
                "min_gpus": table.to_dict(orient="records"),
            }
        )
    else:
        emit_frame(table, args.format)
    return 0 if table["min_gpus"].notna().any() else 1


def add_predict_arguments(p: argparse.ArgumentParser) -> None:
    """flm predict's --tokens and --confidence."""
    p.add_argument(
        "--tokens",
        type=tokens,
        default=None,
        metavar="T",
        help="token budget, e.g. 2e13, 20T, 300B: adds steps, days, node-hours, "
        "GPU-hours and energy with their intervals",
    )
    p.add_argument(
        "--confidence",
        type=fraction,
        default=DEFAULT_CONFIDENCE,
        metavar="C",
        help=f"confidence of the intervals (default {DEFAULT_CONFIDENCE}): the "
        "model's measured out-of-sample error on the calibration runs",
    )


def predict_extras(
    out: dict, layout, model: ModelSpec, system: SystemSpec, args: argparse.Namespace
) -> dict:
    """planner.annotations.predict_extras with the flags' values (--confidence, --tokens)."""
    return annotations.predict_extras(out, layout, model, system, confidence=args.confidence,
                                      tokens=args.tokens)


def predict_lines(extra: dict) -> list[str]:
    """flm predict's table lines for the intervals and the token budget."""
    c = f"{extra['interval_confidence']:.0%}"
    lines = [
        f"interval    {c}: step {extra['step_time_s_low']:.4g}-"
        f"{extra['step_time_s_high']:.4g} s, memory "
        f"{extra['peak_memory_bytes_low'] / 1e9:.2f}-"
        f"{extra['peak_memory_bytes_high'] / 1e9:.2f} GB: {extra['memory_verdict']} "
        f"({extra['interval_basis']})"
    ]
    if "train_days" in extra:
        lines.append(
            f"budget      {extra['tokens']:.3g} tokens: {extra['steps']:,} steps, "
            f"{extra['train_days']:.1f} days ({extra['train_days_low']:.1f}-"
            f"{extra['train_days_high']:.1f}), {extra['node_hours']:,.0f} node-hours "
            f"({extra['node_hours_low']:,.0f}-{extra['node_hours_high']:,.0f}), "
            f"{extra['gpu_hours']:,.0f} GPU-hours, {extra['energy_kwh'] / 1e3:,.1f} MWh"
        )
    return lines


def add_report_arguments(q: argparse.ArgumentParser) -> None:
    """flm report plan's flags."""
    from frontier_llm.specs.layout import DType, Engine, FP8Recipe

    q.add_argument("--model", required=True, help="catalog name or YAML path")
    q.add_argument("--system", required=True, help="catalog name or YAML path")
    q.add_argument(
        "--tokens",
        type=tokens,
        required=True,
        metavar="T",
        help="token budget, e.g. 2e13, 20T, 300B",
    )
    q.add_argument("--out", required=True, metavar="DIR", help="folder for the report files")
    q.add_argument(
        "--deadline",
        type=days,
        default=None,
        metavar="D",
        help="draw the deadline (45d, 12w, 36h) and circle the GPU count that meets "
        "it for the fewest node-hours",
    )
    q.add_argument(
        "--curve",
        type=curve_range,
        default=DEFAULT_CURVE,
        metavar="LO-HI",
        help="power-of-two GPU counts from LO to HI (default: one node's GPUs to 65,536)",
    )
    q.add_argument(
        "--engine",
        default="native",
        choices=Engine.words(),
        help="the training engine to plan for (default native)",
    )
    q.add_argument("--dtype", choices=DType.words(), default="bf16",
                   help="training precision (default bf16); fp8 only on GPUs with FP8 tensor "
                        "cores (docs/costmodel.md 'FP8')")
    q.add_argument("--fp8-recipe", choices=FP8Recipe.words(), default="tensorwise",
                   help="FP8 scaling with --dtype fp8 (default tensorwise)")
    add_p2p_overlap(q, "; with --engine megatron only")
    add_tp_overlap(q, "; with --engine megatron only")
    q.add_argument(
        "--global-batch",
        type=count(1),
        default=None,
        metavar="N",
        help="sequences per iteration at every count, as flm plan --global-batch (default: "
        "4M tokens in whole sequences, splittable over the largest count)",
    )
    q.add_argument(
        "--confidence",
        type=fraction,
        default=DEFAULT_CONFIDENCE,
        metavar="C",
        help=f"confidence of the bands (default {DEFAULT_CONFIDENCE})",
    )


P2P_NOTE = "; interleaved pipeline sends overlapped (--overlap-p2p-comm on)"
TP_NOTE = "; TP communication overlapped with the GEMMs (--tp-comm-overlap on)"


def run_report_plan(args: argparse.Namespace) -> int:
    """flm report plan: the allocation curve as CSV, Markdown, PNG and PDF."""
    from pathlib import Path

    from frontier_llm.catalog import load_model, load_system
    from frontier_llm.errors import UserError
    from frontier_llm.report.allocation import allocation_report
    from frontier_llm.report.tables import file_word

    if Path(args.out).exists() and not Path(args.out).is_dir():
        # Before the planning: mkdir's "File exists" came after it, and said nothing useful.
        raise UserError(f"--out {args.out} is a file: flm report plan writes four files "
                        "(NAME.csv, .md, .png, .pdf) into a folder; give a folder")
    p2p_overlap = p2p_overlap_from_args(args)
    if p2p_overlap and args.engine != "megatron":
        # One engine is planned here: the setting would change nothing in the report.
        raise UserError(f"--overlap-p2p-comm on is Megatron-LM's (its interleaved schedule): "
                        f"it does nothing for --engine {args.engine}; use --engine megatron")
    tp_comm_overlap = tp_overlap_from_args(args)
    if tp_comm_overlap and args.engine != "megatron":
        # As for the p2p overlap: one engine is planned, and only Megatron-LM's changes.
        raise UserError(f"--tp-comm-overlap on is Megatron-LM's (TransformerEngine's TP "
                        f"overlap): it does nothing for --engine {args.engine}; use --engine "
                        "megatron")
    model, system = load_model(args.model), load_system(args.system)
    counts = curve_counts(args, system)
    space = SearchSpace(engine=(args.engine,), dtype=args.dtype,
                        **({"fp8_recipe": (args.fp8_recipe,)} if args.dtype == "fp8" else {}))
    with Progress(f"planning {len(counts)} GPU counts") as bar:
        cur = alloc.allocation_curve(
            model,
            system,
            counts,
            args.tokens,
            args.confidence,
            space,
            on_count=lambda i: bar.update(i, len(counts)),
            global_batch=args.global_batch,
            tp_comm_overlap=tp_comm_overlap,
            p2p_overlap=p2p_overlap,
        )
    selection = alloc.select_deadline(cur, args.deadline) if args.deadline else None
    batches = cur["batch_tokens"].dropna()
    label = "GCDs" if "GCD" in system.gpu else "GPUs"
    # The names come from YAML files: as one file name, ``../..`` or ``/x`` stays in --out.
    name = file_word(f"{model.name}-{system.name}-plan")
    flops, params = six_nd(model, args.tokens)
    bases = [b for b in cur["interval_basis"].astype(str) if b and b != "nan"]
    notes = [
        f"{model.name} ({params}) on {system.name}, "
        f"{args.tokens:.3g} tokens: 6ND = {flops:.3g} FLOPs; engine {args.engine}"
        f"{'' if args.dtype == 'bf16' else f', {args.dtype}'}"
        f"{f' ({args.fp8_recipe} scaling)' if args.dtype == 'fp8' else ''}"
        f"{P2P_NOTE if p2p_overlap else ''}"
        f"{TP_NOTE if tp_comm_overlap else ''}"
        "; at each GPU "
        "count the planner's fastest layout that fits",
        alloc.batch_note(cur, model.seq_len, grown=False) if args.global_batch is None else
        f"global batch: {args.global_batch:,} sequences = "
        f"{args.global_batch * model.seq_len / 1e6:.3g}M tokens at every GPU count "
        "(--global-batch)",
        alloc.rests_on(system),
        f"bands: {args.confidence:.0%} intervals from the cost model's out-of-sample error "
        f"({bases[0] if bases else 'no layout fits at any count'})",
        alloc.power_note(system),
        "node-hours count whole nodes; days assume the job runs without queue waits, failures "
        "or restarts",
    ]
    if selection is not None:
        notes.append(selection.message)
    paths = allocation_report(
        cur,
        args.out,
        name,
        f"{model.name} on {system.name}: {alloc.format_tokens(args.tokens)} tokens, "
        f"{args.engine}, batch {', '.join(sorted(set(map(alloc.format_tokens, batches))))} "
        "tokens a step",
        notes,
        args.deadline,
        None if selection is None or selection.row is None else int(selection.row["gpus"]),
        label,
    )
    for p in paths:
        print(f"wrote {p}")
    if selection is not None:
        print(f"flm report plan: {selection.message}")
    return 0
