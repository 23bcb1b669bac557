"""flm collect, flm results, flm validate, flm db: the results database from the command line."""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from frontier_llm.cli import readable
from frontier_llm.cli.common import add_command, add_format, db_parent, emit_frame, emit_json
from frontier_llm.cli.numbers import count
from frontier_llm.cli.progress import Progress
from frontier_llm.specs.values import printable, printable_path
from frontier_llm.store import SCHEMA_VERSION, open_existing, open_store
from frontier_llm.store.engine_compare import (
    RESULT_LABELS,
    VALIDATION_LABELS,
    compare_runs,
    compare_validation,
    table_view,
)
from frontier_llm.store.ingest import DEFAULT_BATCH, collect
from frontier_llm.store.queries import (
    error_stats,
    final_losses,
    runs_frame,
    validated_runs,
    validation_frame,
)
from frontier_llm.trainers import NAMES, spellings

# What `flm results` and `flm validate` show as a table: cli/readable.py; --all, csv and json
# carry every column.
_ALL = "every column at full precision (the table shows the main ones in their units)"


# What one row of --by-engine is: a layout, the same on every engine.
_SAME_LAYOUT = ("the runs of one model, system and world size whose layout fields, the "
                "global batch among them, differ in the engine alone")
BY_ENGINE_RESULTS = (
    f"one row per layout ({_SAME_LAYOUT}), each engine's columns side by side: completed "
    "runs, median step time, tokens/s per GPU, peak memory and final loss "
    "(<engine>_<measure>), and deepspeed over native for step time, tokens/s per GPU and peak "
    "memory (<measure>_deepspeed_over_native); an engine with no run of the layout is blank")
BY_ENGINE_VALIDATE = (
    f"one row per layout ({_SAME_LAYOUT}), each engine's measured and predicted step time "
    "and its signed step-time and memory errors side by side (blank where the engine has no "
    "run), then the error statistics per system and engine")


# Which figure measured_mfu is (issue 36): the same count as predicted_mfu for every run.
MEASURED_MFU = (
    "measured_mfu is flm's: the model FLOPs of the global batch (costmodel/flops.py) over the "
    "measured step time, for every run, trainer-log runs too, since predicted_mfu counts the "
    "same way; a trainer's own TFLOP/s counts its own way (recompute, multiply-adds, "
    "attention), so it is kept beside it in the trace (summary.trainer_tflops_per_gpu) and not "
    "compared (docs/trainer-logs.md)")


def _err(line: str) -> None:
    """One line on stderr, its control and bidi characters escaped (a file name or a log's
    text may hold them)."""
    print(printable_path(line), file=sys.stderr, flush=True)


def _logs_to_traces(args: argparse.Namespace) -> tuple[str, list]:
    """flm collect --from-logs: write one trace per run of the logs into --traces; returns the
    sentence saying what was read and the traces written (then collected like any others)."""
    from frontier_llm.errors import UserError
    from frontier_llm.logs.traces import LogOptions, logs_to_traces, parse_layout_option
    from frontier_llm.trainers import get

    if args.dirs:
        raise UserError("collect: give trace folders or --from-logs, not both")
    if args.trainer is None:
        # Asked for with what every run needs whatever its log says (no log states the system,
        # and --model names the run even where the log prints the shape): one message.
        also = [o for o, v in (("--system NAME", args.system), ("--model NAME", args.model))
                if v is None]
        raise UserError("collect --from-logs: say which trainer wrote the logs: give --trainer "
                        + "|".join(NAMES) + "".join(f" {o}" for o in also))
    options = LogOptions(system=args.system, model=args.model,
                         layout=parse_layout_option(args.layout or ""), sweep=args.sweep)
    # The registry names the trainer's parser (Megatron-DeepSpeed's is Megatron's).
    report = logs_to_traces(args.from_logs, get(args.trainer).log_reader.name, options, args.traces,
                            any_owner=args.any_owner)
    for line in report.skipped:
        _err(f"flm collect: not read {line}")
    ask = report.ask()
    if not report.traces and report.refused:  # nothing to store: exit 2, every reason
        for line in report.refused if ask else report.refused[1:]:
            _err(f"flm collect: refused {line}")
        raise UserError(f"collect --from-logs: nothing stored: {ask or report.refused[0]}")
    for line in report.refused:
        _err(f"flm collect: refused {line}")
    for line in report.warnings:
        _err(f"flm collect: warning: {line}")
    if ask:
        _err(f"flm collect: {ask}")
    return report.summary(), report.traces


def _collect(args: argparse.Namespace) -> int:
    from frontier_llm.errors import UserError

    read = None
    if args.from_logs:
        # Only the traces of these logs are collected (not what else --traces holds).
        read, args.dirs = _logs_to_traces(args)
    elif not args.dirs:
        raise UserError("collect: give at least one folder of traces (or --from-logs LOG ...)")
    _check_quarantine(args.quarantine, args.dirs)
    store = open_store(args.db)
    try:
        with Progress("collect", enabled=False if args.quiet else None) as bar:
            report = collect(store, args.dirs, quarantine=args.quarantine,
                             batch_size=args.batch_size,
                             progress=None if args.quiet else bar.log,
                             advance=lambda done, total: bar.update(done, total))
    finally:
        store.close()
    # Names and reasons come from files others wrote: escapes, not raw control characters.
    for path, reason in report.quarantined:
        _err(f"flm collect: quarantined {printable_path(path)}: {printable(reason)}")
    for warning in report.warnings:
        _err(f"flm collect: warning: {printable(warning)}")
    if args.format == "json":
        emit_json({"db": store.url_redacted, **report.as_dict(),
                   **({"logs": read} if read else {})})
    else:
        if read:
            print(read)
        print(report.summary(store.url_redacted))
    return 0


def _results(args: argparse.Namespace) -> int:
    store = open_existing(args.db)
    if args.by_engine:
        try:
            runs = runs_frame(store, sweep=args.sweep).merge(
                final_losses(store, sweep=args.sweep), on="run_id", how="left")
        finally:
            store.close()
        wide = compare_runs(runs)
        emit_frame(table_view(wide, RESULT_LABELS) if args.format == "table" else wide,
                   args.format)
        return 0
    try:
        df = _with_unmeasured_attempts(store, runs_frame(store, sweep=args.sweep), args.sweep)
    finally:
        store.close()
    if args.format == "table" and not args.all:
        df = readable.run_table(df, readable.RESULT_FIGURES)
    elif args.format != "table":
        for c in ("started_at", "finished_at"):
            df[c] = df[c].map(lambda t: t.isoformat() if pd.notna(t) else None)
    emit_frame(df, args.format)
    return 0


def _with_unmeasured_attempts(store, df: pd.DataFrame, sweep: str | None) -> pd.DataFrame:
    """Add a row for each ended job attempt that left no trace (a node failed under it, it
    was preempted or lost): its state as ``status`` and its reason as ``error``, so a sweep's
    results show every attempt, not only those that measured something."""
    from sqlalchemy import select

    from frontier_llm.store.schema import flm_attempts, flm_sweeps

    a, s = flm_attempts, flm_sweeps
    stmt = select(a.c.run_id, s.c.name.label("sweep_name"), a.c.job_key,
                  a.c.state.label("status"), a.c.reason.label("error"), a.c.started_at,
                  a.c.finished_at).select_from(a.join(s, a.c.sweep_id == s.c.id))
    if sweep is not None:
        stmt = stmt.where(s.c.name == sweep)
    with store.read() as conn:
        extra = pd.DataFrame([tuple(r) for r in conn.execute(stmt)],
                             columns=["run_id", "sweep_name", "job_key", "status", "error",
                                      "started_at", "finished_at"])
    extra = extra[~extra["run_id"].isin(df["run_id"])]
    if extra.empty:
        return df
    for c in ("started_at", "finished_at"):
        extra[c] = pd.to_datetime(extra[c], utc=True)
    return pd.concat([df, extra], ignore_index=True).sort_values(
        ["sweep_name", "run_id"], na_position="last", ignore_index=True)


def _fmt_table(df: pd.DataFrame) -> pd.DataFrame:
    return readable.rounded_stats(df)


def _validate(args: argparse.Namespace) -> int:
    if args.by_engine:
        return _validate_by_engine(args)
    store = open_existing(args.db)
    try:
        runs = validation_frame(store, sweep=args.sweep, costmodel_version=args.costmodel_version)
    finally:
        store.close()
    runs = _plausible_only(runs)
    _emit_validation(args, "runs", runs,
                     _fmt_table(runs) if args.all else
                     readable.run_table(runs, readable.VALIDATION_FIGURES),
                     "predicted vs measured (error = (predicted - measured) / measured):\n"
                     + MEASURED_MFU,
                     error_stats(runs), "per system")
    return 0


def _check_quarantine(quarantine: str | None, dirs: list[str]) -> None:
    """Refuse a --quarantine folder that holds a folder being collected (``--quarantine /``):
    collect skips what lies in its quarantine folder, so it would read nothing and exit 0."""
    from pathlib import Path

    from frontier_llm.errors import UserError

    if not quarantine:
        return
    q = Path(quarantine).resolve()
    for d in dirs:
        if Path(d).resolve().is_relative_to(q):
            raise UserError(f"collect: --quarantine {printable_path(quarantine)} holds "
                            f"{printable_path(d)}, which is being collected (files in the "
                            "quarantine folder are skipped, so nothing would be read); give a "
                            "folder of its own")


def _plausible_only(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs whose measured step time and memory peak are plausible (specs/plausible.py);
    the rest (a database an older flm filled) are left out of the statistics, with a warning
    on stderr that names them."""
    from frontier_llm.specs.plausible import memory_problem, step_time_problem

    why = [step_time_problem(_number(t), "measured step time")
           or memory_problem(_number(m), "measured peak memory")
           for t, m in zip(runs["measured_step_time_s"], runs["measured_peak_memory_bytes"],
                           strict=True)]
    bad = [f"{rid}: {w}" for rid, w in zip(runs["run_id"], why, strict=True) if w]
    if bad:
        print(f"flm: warning: left out {len(bad)} run(s) whose measurement is not plausible: "
              f"{'; '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}", file=sys.stderr)
    return runs[[w is None for w in why]].reset_index(drop=True)


def _number(value: object) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _emit_validation(args: argparse.Namespace, key: str, rows: pd.DataFrame,
                     shown: pd.DataFrame, title: str, stats: pd.DataFrame, per: str) -> None:
    """flm validate's output in every format: the rows (``shown`` as the table) and the error
    statistics (``per`` names their grouping)."""
    if args.format == "json":
        emit_json({key: rows.to_dict(orient="records"),
                   "stats": stats.to_dict(orient="records")})
    elif args.format == "csv":
        emit_frame(stats if args.stats_only else rows, "csv")
    else:
        if not args.stats_only:
            print(title)
            emit_frame(shown, "table")
            print()
        print(f"error statistics {per} (MAPE = mean absolute percentage error):")
        emit_frame(_fmt_table(stats), "table")


def _validate_by_engine(args: argparse.Namespace) -> int:
    """flm validate --by-engine: each layout's engines side by side, statistics per system x
    engine."""
    from frontier_llm.report.errors import ERROR_COLUMNS, errors_table  # flm report's

    store = open_existing(args.db)
    try:
        runs = validated_runs(runs_frame(store, sweep=args.sweep,
                                         costmodel_version=args.costmodel_version))
    finally:
        store.close()
    wide = compare_validation(runs)
    # flm report's table: per system x engine, with the mean signed error (bias) too.
    stats = errors_table(runs) if not runs.empty else pd.DataFrame(columns=ERROR_COLUMNS)
    _emit_validation(args, "layouts", wide, table_view(wide, VALIDATION_LABELS),
                     "predicted vs measured per engine (error = (predicted - measured) / "
                     "measured, mean over the layout's runs):", stats, "per system and engine")
    return 0


def _db(args: argparse.Namespace) -> int:
    if args.action == "upgrade":
        store = open_existing(args.db, check=False)  # a mistyped path creates nothing
        try:
            before = store.schema_version()
            ran = store.upgrade()
        finally:
            store.close()
        if ran:
            print(f"upgraded {store.url_redacted} from schema version {before} to "
                  f"{SCHEMA_VERSION} (migrations {', '.join(map(str, ran))})")
        else:
            print(f"{store.url_redacted} is at schema version {SCHEMA_VERSION}; nothing to do")
        return 0
    # A look, not a write: a mistyped path is an error, never a new empty database.
    store = open_existing(args.db, check=False)
    try:
        version = store.schema_version()
    finally:
        store.close()
    state = ("current" if version == SCHEMA_VERSION else
             "older: run 'flm db upgrade'" if (version or 0) < SCHEMA_VERSION else
             "newer: upgrade frontier_llm")
    print(f"database: {store.url_redacted}\nschema version: {version} ({state}; this "
          f"frontier_llm uses {SCHEMA_VERSION})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    db = db_parent()
    p = add_command(
        sub, "collect", "ingest trace files into the results database",
        "Ingest every *.trace.json below the given folders. Idempotent: a file already stored "
        "is skipped, a rewritten one (more steps) updates its run. One transaction per batch. "
        "A corrupt or schema-invalid file moves to DIR/quarantine/ (or --quarantine) with a "
        "<file>.reason.txt and the rest goes on. Several collectors may run at once.",
        ["flm collect runs/", "flm collect runs/ --db postgresql://me@dbhost/flm",
         "flm collect runs/a runs/b --quarantine bad/ --format json",
         "flm collect --from-logs logs/ --trainer megatron --system frontier --model gpt-22b",
         "flm collect --from-logs titan.log --trainer torchtitan --system h100-sxm "
         "--model llama3-8b --layout micro_batch=1,global_batch=64"],
        parents=[db],
    )
    p.add_argument("dirs", nargs="*", metavar="DIR", help="folders (searched recursively)")
    logs = p.add_argument_group(
        "training logs of other trainers (docs/trainer-logs.md)",
        "Read logs as Megatron-LM / Megatron-DeepSpeed, torchtitan or DeepSpeed write them: "
        "the layout and model shape from the arguments or configuration they print, the step "
        "lines after warm-up (the first logged step and steps 1-2 are dropped; a run of "
        "warm-up steps only is refused), several runs per file, rank prefixes (srun --label, "
        "torchrun), step times in ms or s. Each run becomes a trace in --traces and is "
        "collected like an flm bench run. What a log does not state is given here, never "
        "guessed: a run that lacks it is refused in one line naming every option it lacks. "
        "Below a folder, links out of it are not followed and other users' files are read "
        "only with --any-owner; lines over 64 KiB are skipped. The summary counts what was "
        "skipped, and warns where a trainer's own TFLOP/s is more than 3x flm's.")
    logs.add_argument("--from-logs", nargs="+", metavar="PATH",
                      help="log files or folders of them (every file below a folder is read)")
    logs.add_argument("--trainer", choices=spellings(), metavar="TRAINER",
                      help="which trainer wrote the logs: " + ", ".join(NAMES)
                           + " (or an alias: megatron for either Megatron; flm export's names)")
    logs.add_argument("--system", metavar="S",
                      help="the system the runs ran on (a catalog name or a YAML file): no log "
                           "states it")
    logs.add_argument("--model", metavar="M",
                      help="the model (a catalog name or YAML file; or, where the log prints "
                           "the whole shape, the name to store it under)")
    logs.add_argument("--layout", metavar="FIELD=V,...",
                      help="layout fields the logs do not print, e.g. "
                           "'dp=8,micro_batch=1,global_batch=64' (field names as in flm bench; "
                           "zero=N for the sharding); a value the log prints must agree")
    logs.add_argument("--sweep", metavar="NAME",
                      help="the sweep the runs are stored under, for flm validate --sweep and "
                           "flm calibrate --from-runs --sweep (default: logs-<system>)")
    logs.add_argument("--any-owner", action="store_true",
                      help="also read files below a folder that another user owns (a team's "
                           "shared log folder); without it they are skipped and counted. Links "
                           "out of a folder are never followed; a file named on the command "
                           "line is always read")
    logs.add_argument("--traces", metavar="DIR", default="log-traces",
                      help="where the traces made from the logs are written and collected from "
                           "(default: log-traces/)")
    p.add_argument("--quarantine", metavar="DIR", default=None,
                   help="where bad files go (default: quarantine/ in the DIR they were found in)")
    p.add_argument("--batch-size", type=count(1), default=DEFAULT_BATCH, metavar="N",
                   help=f"traces per transaction (default {DEFAULT_BATCH})")
    p.add_argument("--quiet", action="store_true",
                   help="no progress on stderr (neither the per-batch lines nor, at a "
                        "terminal, the progress bar)")
    add_format(p, choices=("table", "json"))
    p.set_defaults(func=_collect)

    p = add_command(
        sub, "results", "list stored runs with their layouts and predictions",
        "One row per run: status, layout, measured step time, throughput, MFU and peak memory, "
        "and the cost model's prediction for the same layout. The table shows the main "
        "columns; csv and json carry all of them.",
        ["flm results", "flm results --sweep tp-study --format csv > runs.csv",
         "flm results --sweep engines --by-engine"],
        parents=[db],
    )
    p.add_argument("--sweep", metavar="NAME", help="only runs of this sweep")
    p.add_argument("--by-engine", action="store_true", help=BY_ENGINE_RESULTS)
    p.add_argument("--all", action="store_true", help=_ALL)
    add_format(p)
    p.set_defaults(func=_results)

    p = add_command(
        sub, "validate", "compare predicted with measured step time and memory",
        "For each completed run with a prediction: measured and predicted step time and peak "
        "memory with the signed error in percent; then per system the mean absolute percentage "
        "error (MAPE) and the largest one. json holds both; csv the per-run rows (or the "
        "statistics with --stats-only).",
        ["flm validate", "flm validate --sweep tp-study --stats-only",
         "flm validate --format json", "flm validate --by-engine --stats-only"],
        parents=[db],
    )
    p.add_argument("--sweep", metavar="NAME", help="only runs of this sweep")
    p.add_argument("--costmodel-version", metavar="V",
                   help="compare with this cost-model version's predictions (default: the one "
                   "each run's trace carried)")
    p.add_argument("--stats-only", action="store_true", help="only the error statistics")
    p.add_argument("--by-engine", action="store_true", help=BY_ENGINE_VALIDATE)
    p.add_argument("--all", action="store_true", help=_ALL)
    add_format(p)
    p.set_defaults(func=_validate)

    p = add_command(
        sub, "db", "database schema version and upgrades",
        "'version' prints the database's schema version and this frontier_llm's; 'upgrade' "
        "runs the migrations that bring an older database to it (other commands refuse an "
        "older database until then, and always refuse a newer one).",
        ["flm db version", "flm db upgrade --db sqlite:///runs/flm.db"],
        parents=[db],
    )
    p.add_argument("action", choices=("upgrade", "version"))
    p.set_defaults(func=_db)
