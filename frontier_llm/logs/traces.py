"""A parsed run -> an flm trace (bench/trace_schema.json), and logs -> the store.

The trace is what ``flm bench`` writes for a run of its own: the same summary (median step time
over the steps after warm-up, tokens/s, TFLOP/s per GPU, MFU), the cost model's prediction for
the layout, and labels saying where it came from (``source: trainer-log``, ``log``, ``log_run``,
``trainer``). Traces are written to a folder and stored by :func:`store.ingest.collect`, so
quarantine, deduplication and the one-line errors are those of ``flm collect``.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

from frontier_llm.bench.trace import validate_trace, write_trace
from frontier_llm.errors import UserError
from frontier_llm.logs import TRAINERS
from frontier_llm.logs.common import LogError, ParsedLog, ParsedRun, parse_text, read_text
from frontier_llm.logs.deepspeed import samples_per_s
from frontier_llm.specs.forms import ALWAYS_SHOWN, SCALED
from frontier_llm.specs.identity import layout_hash
from frontier_llm.specs.layout import Layout, complete_layout, layout_fields, layout_types
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.vocab import RunStatus

# Fields a run must state (in its log or in --layout): without them its step time means nothing.
# They are those the one label always writes (specs.forms: the degrees and both batches).
REQUIRED = tuple(dict.fromkeys((*ALWAYS_SHOWN, *SCALED)))


class RunRefused(UserError):
    """A run of a log that cannot become a trace (what it lacks, in one line)."""


@dataclass
class LogOptions:
    """What the user states for what the logs do not (``--system``, ``--model``, ``--layout``)."""

    system: str | None = None
    model: str | None = None
    layout: dict[str, object] = field(default_factory=dict)
    # The runs' sweep label: flm validate --sweep and flm calibrate --from-runs --sweep select
    # runs by it. Default: logs-<system> (calibration fits one system's runs).
    sweep: str | None = None
    # A sweep job's own model and layout (python -m frontier_llm.logs.job): they are what the
    # job ran, so they are used as given, and the log's own statements are not read for them.
    model_spec: ModelSpec | None = None
    layout_spec: Layout | None = None


def parse_layout_option(text: str) -> dict[str, object]:
    """``tp=8,pp=2,dp=4,micro_batch=1,global_batch=64,zero=1`` -> layout values (the field
    names of specs/layout.py; ``zero`` the sharding shorthand). UserError for a bad item."""
    types = layout_types()
    out: dict[str, object] = {}
    for item in filter(None, (p.strip() for p in text.replace(" ", ",").split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or (key not in types and key != "zero"):
            raise UserError(f"--layout: {item!r} is not FIELD=VALUE with FIELD one of "
                            f"{', '.join([*types, 'zero'])}")
        kind = types.get(key, int)
        if kind is bool:
            out[key] = value.lower() in ("1", "true", "on", "yes")
        elif kind is int:
            try:
                out[key] = int(value)
            except ValueError:
                raise UserError(f"--layout: {key}={value!r} is not an integer") from None
        else:
            out[key] = value
    return out


def parse_log(path: str | Path, trainer: str) -> ParsedLog:
    """Read one log with the named trainer's parser; LogError (one line) for a refused file."""
    if trainer not in TRAINERS:
        raise UserError(f"unknown trainer {trainer!r}: one of {', '.join(TRAINERS)}")
    path = Path(path)
    return parse_text(TRAINERS[trainer], read_text(path), path)


def run_id(path: Path, index: int) -> str:
    """Deterministic: the same log and run always give the same run_id (dedup in the store)."""
    digest = hashlib.sha256(f"{path.resolve()}\0{index}".encode()).hexdigest()[:16]
    return f"log-{digest}-{index}"


def _layout(run: ParsedRun, options: LogOptions) -> tuple[Layout, list[str]]:
    """The run's layout: what the log states, then --layout for what it does not. A value
    stated by both must agree (the log is the record of what ran)."""
    if options.layout_spec is not None:
        return options.layout_spec, []
    values = dict(run.layout)
    for key, value in options.layout.items():
        stated = values.get("sharding" if key == "zero" else key)
        if stated is not None and key != "zero" and str(stated) != str(value):
            raise RunRefused(f"--layout {key}={value} contradicts the log ({key}={stated})")
        values.setdefault(key, value)
    missing = [k for k in REQUIRED if k not in values]
    if missing:
        raise RunRefused(f"the log does not state {', '.join(missing)}: give --layout "
                         f"{','.join(f'{k}=N' for k in missing)}")
    defaulted = [f.name for f in layout_fields()
                 if f.name not in values and not (f.name == "sharding" and "zero" in values)]
    try:
        return Layout.from_dict(complete_layout(values)), defaulted
    except (UserError, ValueError, TypeError) as exc:
        raise RunRefused(f"layout: {exc}") from None


def _model(run: ParsedRun, options: LogOptions) -> ModelSpec:
    from frontier_llm.catalog import load_model

    if options.model_spec is not None:
        return options.model_spec
    if options.model is None and not run.model:
        raise RunRefused("the log does not print the model shape: give --model NAME")
    base: dict[str, object] = {}
    name = options.model
    if options.model is not None:
        try:
            base = load_model(options.model).to_dict()
        except UserError:
            if {"layers", "hidden", "heads", "seq_len", "vocab"} - set(run.model):
                raise
    elif run.model:
        raise RunRefused("the log prints a shape but no model name: give --model NAME")
    for key, value in run.model.items():  # the log's shape is what ran
        if key in ("layers", "hidden", "heads", "kv_heads", "vocab") and base.get(key) not in (
                None, value):
            raise RunRefused(f"the log's {key} {value} differs from --model {name}'s "
                             f"{base[key]}")
        base[key] = value
    base["name"] = name
    base.pop("description", None)
    try:
        return ModelSpec(**base)
    except (UserError, TypeError) as exc:
        raise RunRefused(f"model: {exc}") from None


def _times(run: ParsedRun, layout: Layout, model: ModelSpec) -> None:
    """Step times the log gives as a rate: torchtitan's tokens/s per GPU, DeepSpeed's samples/s."""
    for s in run.steps:
        if s.time_s:
            continue
        if run.trainer == "deepspeed" and (sps := samples_per_s(run, s.step)):
            s.time_s = layout.global_batch / sps
        elif s.tokens_per_s:
            # torchtitan: tps counts the tokens of one data-parallel rank's batch over the
            # time and the cp x tp x pp GPUs that share it (components/metrics.py divides by
            # parallel_dims.non_data_parallel_size = cp * tp * pp; v0.2.2).
            tokens = layout.global_batch // layout.dp * model.seq_len
            s.time_s = tokens / (s.tokens_per_s * layout.tp * layout.pp * layout.cp)


def _status(run: ParsedRun) -> tuple[str, str | None, str]:
    """(status, error, how the log ends). A log that stops before its last iteration with no
    error (a job stopped at its time limit, a file cut) still measured every step it printed:
    completed, and the ``log_end`` label says where it stops."""
    # An error line ends the run only if no step line follows it (a warning's traceback in a
    # run that went on training is not how the run ended).
    if run.status in (RunStatus.OOM, RunStatus.FAILED) and run.error_after == len(run.steps):
        return run.status, run.error, "error"
    last = run.steps[-1].step
    if run.total_steps and last < run.total_steps and not run.finished:
        return RunStatus.COMPLETED, None, f"cut at step {last} of {run.total_steps}"
    return RunStatus.COMPLETED, None, "finished" if run.finished else f"at step {last}"


def _median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def build_trace(run: ParsedRun, path: Path, options: LogOptions) -> dict:
    """The trace of one parsed run; RunRefused says in one line what it lacks."""
    from frontier_llm.bench.run import prediction_fields, summarize
    from frontier_llm.catalog import load_system

    if run.status == "refused":
        raise RunRefused(run.error or "refused")
    if not run.steps:
        raise RunRefused("no step line in this run")
    if options.system is None:
        raise RunRefused("the log does not state the system: give --system NAME")
    system = load_system(options.system)
    layout, defaulted = _layout(run, options)
    model = _model(run, options)
    _times(run, layout, model)
    # A step with no usable time (a rate of 0, a figure that is not finite) is not a measurement.
    run.steps = [s for s in run.steps if math.isfinite(s.time_s) and s.time_s > 0]
    if not run.steps:
        raise RunRefused("no step line with a step time in this run")
    for s in run.steps:
        if s.loss is not None and not math.isfinite(s.loss):
            s.loss = None  # a NaN loss is printed, but JSON (and the store) hold no NaN
    cfg = SimpleNamespace(model=model, system=system, layout=layout)
    warm = run.warmup()
    steps = [{"step": s.step, "time_s": s.time_s, "loss": s.loss, "warmup": w}
             for s, w in zip(run.steps, warm, strict=True)]
    world = layout.world_size
    if run.world_size not in (None, world):
        raise RunRefused(f"the log's world size {run.world_size} is not tp x cp x pp x dp = "
                         f"{world}")
    summary = summarize(cfg, steps, [], world)
    measured = [s for s, w in zip(run.steps, warm, strict=True) if not w]
    # What the trainer printed wins over the formula: it is the trainer's own figure.
    for key, values in (("model_tflops_per_gpu", [s.tflops for s in measured]),
                        ("mfu", [s.mfu for s in measured])):
        if (printed := _median(values)) is not None:
            summary[key] = printed
    peaks = [s.memory_bytes for s in run.steps if s.memory_bytes is not None]
    summary["peak_memory_bytes"] = max(peaks) if peaks else None
    status, error, end = _status(run)
    stamp = datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat(timespec="seconds")
    labels = {"source": "trainer-log", "log": str(path.resolve()), "log_run": str(run.index),
              "trainer": run.trainer, "log_end": end,
              "sweep": options.sweep or f"logs-{system.name}"}
    if defaulted:
        labels["layout_defaulted"] = ",".join(defaulted)
    model_json = model.to_dict()
    model_json.pop("description", None)
    trace = {
        "schema_version": 1, "run_id": run_id(path, run.index), "status": str(status),
        "error": error, "engine": str(layout.engine),
        "started_at": run.first_time or stamp, "finished_at": run.last_time or stamp,
        "model": model_json, "system": {"name": system.name, "gpu": system.gpu},
        "layout": layout.to_dict(), "layout_hash": layout_hash(model, system.name, layout),
        "labels": labels,
        "environment": {"hostnames": [], "world_size": world, "backend": "unknown",
                        "device": "unknown", "launcher": run.trainer,
                        "versions": {"trainer": run.version} if run.version else {}},
        "steps": steps, "memory": [], "summary": summary, **prediction_fields(cfg),
    }
    validate_trace(trace)
    return trace


@dataclass
class LogsReport:
    """What ``flm collect --from-logs`` read, wrote and refused."""

    files: int = 0
    lines: int = 0
    unreadable: int = 0
    runs: int = 0
    traces: list[Path] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # one line each: file or run, and why

    def summary(self) -> str:
        return (f"read {self.files} log files ({self.lines} lines, {self.unreadable} unreadable "
                f"lines skipped): {self.runs} runs, {len(self.traces)} traces written, "
                f"{len(self.refused)} refused")


def logs_to_traces(paths: list[str | Path], trainer: str, options: LogOptions,
                   trace_dir: str | Path) -> LogsReport:
    """Parse every log (a folder: every file below it) and write one trace per run."""
    report = LogsReport()
    for path in _files(paths):
        report.files += 1
        try:
            log = parse_log(path, trainer)
        except LogError as exc:
            report.refused.append(str(exc))
            continue
        report.lines += log.lines
        report.unreadable += log.unreadable
        for run in log.runs:
            report.runs += 1
            try:
                report.traces.append(write_trace(trace_dir, build_trace(run, path, options)))
            except (UserError, ValueError, OverflowError) as exc:  # this run's problem only
                report.refused.append(f"{path} run {run.index}: {exc}")
    return report


def _files(paths: list[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(f for f in p.rglob("*") if f.is_file()))
        elif p.exists():
            out.append(p)
        else:
            raise UserError(f"collect --from-logs: {p} does not exist")
    return out
