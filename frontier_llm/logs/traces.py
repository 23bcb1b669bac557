"""A parsed run -> an flm trace (bench/trace_schema.json), and logs -> the store.

The trace is what ``flm bench`` writes for a run of its own: the same summary (median step time
over the steps after warm-up, tokens/s, TFLOP/s per GPU, MFU), the cost model's prediction for
the layout, and labels saying where it came from (``source: trainer-log``, ``log``, ``log_run``,
``trainer``). The trainer's own TFLOP/s and MFU are kept beside flm's, never in their place.
The record itself is bench.record's ``trace_record``, as for every trace flm writes. Traces are
written to a folder and stored by :func:`store.ingest.collect`, so quarantine, deduplication
and the one-line errors are those of ``flm collect``. Which files of a folder are read:
:func:`log_files`.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

from frontier_llm.bench.record import trace_record
from frontier_llm.bench.trace import validate_trace, write_trace
from frontier_llm.errors import UserError
from frontier_llm.specs.forms import ALWAYS_SHOWN, SCALED
from frontier_llm.specs.layout import Layout, complete_layout, layout_fields, layout_types
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.vocab import RunStatus
from frontier_llm.trainers import LOG_READERS, log_reader
from frontier_llm.trainers.log_reader import (
    MAX_LINE_BYTES,
    WARMUP_STEPS,
    BadNumber,
    LogError,
    ParsedLog,
    ParsedRun,
    Step,
    parse_text,
    read_lines,
)

# Fields a run must state (in its log or in --layout): without them its step time means nothing.
# They are those the one label always writes (specs.forms: the degrees and both batches).
REQUIRED = tuple(dict.fromkeys((*ALWAYS_SHOWN, *SCALED)))
# How far a trainer's own TFLOP/s may sit from flm's before collect warns. Both divide FLOPs by
# the same step time, so they differ only in what they count: full recompute counts the
# forward twice (8/6 = 1.33x: Megatron-DeepSpeed's TFLOPs, an HFU), some count a multiply-add
# as one FLOP instead of two (2x), attention and the logits are counted or not (a few % at
# 2K tokens, more at long context). Together under 3x; beyond it the figure comes from a
# different model, batch or GPU count than the one stored (the 800x of issue 36).
TFLOPS_AGREEMENT = 3.0


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


def parse_log(path: str | Path, trainer: str,
              identity: tuple[int, int] | None = None) -> ParsedLog:
    """Read one log with the reader of the named trainer (any spelling, or a log format:
    ``megatron``); LogError (one line) for a refused file (``identity``: the (device, inode)
    :func:`log_files` listed; log_reader.open_log)."""
    reader = log_reader(trainer)
    path = Path(path)
    others = [r for r in LOG_READERS.values() if r is not reader]
    return parse_text(reader, read_lines(path, identity), path, others)


def run_id(path: Path, index: int) -> str:
    """Deterministic: the same log and run always give the same run_id (dedup in the store)."""
    digest = hashlib.sha256(f"{path.resolve()}\0{index}".encode()).hexdigest()[:16]
    return f"log-{digest}-{index}"


def _layout(run: ParsedRun, options: LogOptions) -> tuple[Layout, list[str]]:
    """The run's layout: what the log states, then --layout for what it does not. A value
    stated by both must agree (the log is the record of what ran)."""
    if options.layout_spec is not None:
        return options.layout_spec, []
    _agrees(run, options)
    values = {**options.layout, **run.layout}
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


def _agrees(run: ParsedRun, options: LogOptions) -> None:
    """RunRefused when --layout says otherwise than the log (the log is the record of what ran)."""
    for key, value in options.layout.items():
        stated = run.layout.get(key)
        if stated is not None and key != "zero" and str(stated) != str(value):
            raise RunRefused(f"--layout {key}={value} contradicts the log ({key}={stated})")


# The shape fields a log may not contradict --model on (the others it states replace the
# model's: the log's shape is what ran).
_STATED = ("layers", "hidden", "heads", "kv_heads", "vocab", "num_experts")


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
        if key in _STATED and base.get(key) not in (None, value):
            raise RunRefused(f"the log's {key} {value} differs from --model {name}'s "
                             f"{base[key]}")
        base[key] = value
    base["name"] = name
    base.pop("description", None)
    try:
        return ModelSpec(**base)
    except (UserError, TypeError) as exc:
        raise RunRefused(f"model: {exc}") from None


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


def missing_options(run: ParsedRun, options: LogOptions) -> list[str]:
    """Every option this run needs that neither its log nor the user states, as the user
    would type it (``--system NAME``, ``--layout tp=N,...``): asked for all at once."""
    out = []
    if options.system is None:
        out.append("--system NAME")
    if options.model_spec is None and options.model is None:
        out.append("--model NAME")
    if options.layout_spec is None:
        stated = {**run.layout, **options.layout}
        if fields := [k for k in REQUIRED if k not in stated]:
            out.append(f"--layout {','.join(f'{k}=N' for k in fields)}")
    return out


def _unstated(missing: list[str]) -> str:
    """One line for every option a run lacks."""
    what = {"--system NAME": "the system", "--model NAME": "the model's name"}
    said = [what.get(m) or m.removeprefix("--layout ").replace("=N", "").replace(",", ", ")
            for m in missing]
    return f"the log does not state {', '.join(said)}: give {' '.join(missing)}"


def _measured(run: ParsedRun) -> list[bool]:
    """The warm-up flags; RunRefused when every logged step is warm-up (a step time from
    them would be start-up cost, not the layout's: stored, it would mislead calibration)."""
    warm = run.warmup()
    if all(warm):
        shown = ", ".join(str(s.step) for s in run.steps[:5]) + (
            ", ..." if len(run.steps) > 5 else "")
        raise RunRefused(
            f"{len(run.steps)} logged step{'s' * (len(run.steps) != 1)} ({shown}), all warm-up "
            f"(the first logged step and steps 1-{WARMUP_STEPS} are not measured): a step "
            f"time needs a logged step after step {max(WARMUP_STEPS, run.steps[0].step)}")
    return warm


def _trainer_figures(summary: dict, measured: list[Step], labels: dict[str, str]) -> None:
    """Keep the trainer's own TFLOP/s and MFU beside flm's, never in their place: flm's
    ``model_tflops_per_gpu`` and ``mfu`` count FLOPs one way for every run (model FLOPs over
    the measured step time, costmodel/flops.py), which is what ``flm validate`` compares with
    the prediction. A trainer counts its own way; beyond TFLOPS_AGREEMENT the label
    ``tflops_disagree`` says by how much (and ``flm collect`` warns)."""
    for key, values in (("trainer_tflops_per_gpu", [s.tflops for s in measured]),
                        ("trainer_mfu", [s.mfu for s in measured]),
                        ("trainer_load_balancing_loss",
                         [s.load_balancing_loss for s in measured])):
        if (printed := _median(values)) is not None:
            summary[key] = printed
            labels[key] = f"{printed:.6g}"
    ours, theirs = summary.get("model_tflops_per_gpu"), summary.get("trainer_tflops_per_gpu")
    if ours and theirs and math.isfinite(ours) and ours > 0:
        ratio = theirs / ours
        if not 1 / TFLOPS_AGREEMENT <= ratio <= TFLOPS_AGREEMENT:
            labels["tflops_disagree"] = (
                f"the trainer printed {theirs:.4g} TFLOP/s/GPU, flm counts {ours:.4g} "
                f"({ratio:.3g}x; more than the {TFLOPS_AGREEMENT:g}x that counting conventions "
                "explain): check --model, the global batch and the GPU count")


def build_trace(run: ParsedRun, path: Path, options: LogOptions) -> dict:
    """The trace of one parsed run; RunRefused says in one line what it lacks."""
    from frontier_llm.bench.run import summarize
    from frontier_llm.catalog import load_system

    if run.status == "refused":
        raise RunRefused(run.error or "refused")
    if not run.steps:
        raise RunRefused("no step line in this run")
    if options.layout_spec is None:
        _agrees(run, options)  # a contradiction first: no missing option mends it
    if missing := missing_options(run, options):
        raise RunRefused(_unstated(missing))
    system = load_system(str(options.system))
    layout, defaulted = _layout(run, options)
    model = _model(run, options)
    # Step times a log gives as a rate (torchtitan's tokens/s, DeepSpeed's samples/s): what a
    # trainer's step time means is its reader's to say.
    log_reader(run.trainer).step_times(run, layout, model)
    # A step with no usable time (a rate of 0, a figure that is not finite) is not a measurement.
    read = len(run.steps)
    run.steps = [s for s in run.steps if math.isfinite(s.time_s) and s.time_s > 0]
    dropped = read - len(run.steps) + int(run.args.get("batch_rampup_steps", 0))
    if not run.steps:
        raise RunRefused("no step line with a step time in this run")
    for s in run.steps:
        if s.loss is not None and not math.isfinite(s.loss):
            s.loss = None  # a NaN loss is printed, but JSON (and the store) hold no NaN
    cfg = SimpleNamespace(model=model, system=system, layout=layout)
    warm = _measured(run)
    steps = [{"step": s.step, "time_s": s.time_s, "loss": s.loss, "warmup": w}
             for s, w in zip(run.steps, warm, strict=True)]
    world = layout.world_size
    if run.world_size not in (None, world):
        raise RunRefused(f"the log's world size {run.world_size} is not tp x cp x pp x dp = "
                         f"{world}")
    summary = summarize(cfg, steps, [], world)
    peaks = [s.memory_bytes for s in run.steps if s.memory_bytes is not None]
    summary["peak_memory_bytes"] = max(peaks) if peaks else None
    status, error, end = _status(run)
    stamp = datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat(timespec="seconds")
    labels = {"source": "trainer-log", "log": str(path.resolve()), "log_run": str(run.index),
              "trainer": run.trainer, "log_end": end,
              "sweep": options.sweep or f"logs-{system.name}"}
    if defaulted:
        labels["layout_defaulted"] = ",".join(defaulted)
    if rampup := run.args.get("batch_rampup_steps"):
        labels["batch_rampup_steps_dropped"] = rampup
    if dropped:  # step lines read but not stored: counted in collect's summary
        labels["steps_dropped"] = str(dropped)
    _trainer_figures(summary, [s for s, w in zip(run.steps, warm, strict=True) if not w],
                     labels)
    trace = trace_record(
        cfg, run_id=run_id(path, run.index), status=status, error=error,
        started_at=run.first_time or stamp, finished_at=run.last_time or stamp, labels=labels,
        environment={"hostnames": [], "world_size": world, "backend": "unknown",
                     "device": "unknown", "launcher": run.trainer,
                     "versions": {"trainer": run.version} if run.version else {}},
        steps=steps, summary=summary)
    validate_trace(trace)
    return trace


@dataclass
class LogsReport:
    """What ``flm collect --from-logs`` read, wrote, skipped and refused."""

    files: int = 0
    lines: int = 0
    unreadable: int = 0
    long_lines: int = 0  # lines longer than common.MAX_LINE_BYTES, skipped unread
    dropped_steps: int = 0  # step lines of stored runs left out (no usable time, a ramp-up)
    runs: int = 0
    traces: list[Path] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # one line each: file or run, and why
    skipped: list[str] = field(default_factory=list)  # files not read: links out, others' files
    warnings: list[str] = field(default_factory=list)  # stored, but a figure to look at
    # Each option some refused run lacks -> those runs: one line can ask for all of them.
    missing: dict[str, list[str]] = field(default_factory=dict)

    def ask(self) -> str | None:
        """One line giving every option the refused runs lack (None when none lacks one)."""
        if not self.missing:
            return None
        fields = dict.fromkeys(f for m in self.missing if m.startswith("--layout ")
                               for f in m.removeprefix("--layout ").split(","))
        options = [m for m in ("--system NAME", "--model NAME") if m in self.missing]
        if fields:
            options.append(f"--layout {','.join(fields)}")
        runs = len({r for v in self.missing.values() for r in v})
        need = "1 run needs" if runs == 1 else f"{runs} runs need"
        return f"{need} what the logs do not state: give {' '.join(options)}"

    def summary(self) -> str:
        text = (f"read {self.files} log files ({self.lines} lines, {self.unreadable} unreadable "
                f"lines skipped): {self.runs} runs, {len(self.traces)} traces written, "
                f"{len(self.refused)} refused")
        extra = []
        if self.dropped_steps:
            extra.append(f"{self.dropped_steps} step lines dropped (no usable step time, or a "
                         "batch ramp-up's smaller batch)")
        if self.long_lines:
            extra.append(f"{self.long_lines} lines longer than {MAX_LINE_BYTES >> 10} KiB "
                         "skipped unread")
        if self.skipped:
            extra.append(f"{len(self.skipped)} files not read (links out of the folder, "
                         "other users' files)")
        if self.warnings:
            extra.append(f"{len(self.warnings)} runs whose trainer's TFLOP/s disagrees with "
                         "flm's")
        return text + "".join(f"; {e}" for e in extra)


def logs_to_traces(paths: list[str | Path], trainer: str, options: LogOptions,
                   trace_dir: str | Path, any_owner: bool = False) -> LogsReport:
    """Parse every log (a folder: every file below it, see :func:`log_files`) and write one
    trace per run."""
    report = LogsReport()
    files, report.skipped = log_files(paths, any_owner)
    for listed in files:
        path = listed.path
        report.files += 1
        try:
            log = parse_log(listed.target, trainer, listed.identity)
            log.path = path
        except BadNumber as exc:  # raised inside a parser, which does not know the file
            report.refused.append(f"{path}: {exc}")
            continue
        except LogError as exc:
            report.refused.append(str(exc))
            continue
        except (UserError, ValueError, OverflowError) as exc:  # this file's problem only
            report.refused.append(f"{path}: {exc}")
            continue
        report.lines += log.lines
        report.unreadable += log.unreadable
        report.long_lines += log.long_lines
        for run in log.runs:
            report.runs += 1
            try:
                trace = build_trace(run, path, options)
                report.traces.append(write_trace(trace_dir, trace))
            except (UserError, ValueError, OverflowError) as exc:  # this run's problem only
                report.refused.append(f"{path} run {run.index}: {exc}")
                for option in missing_options(run, options) if run.steps else ():
                    report.missing.setdefault(option, []).append(f"{path} run {run.index}")
                continue
            report.dropped_steps += int(trace["labels"].get("steps_dropped", 0))
            if why := trace["labels"].get("tflops_disagree"):
                report.warnings.append(f"{path} run {run.index}: {why}")
    return report


@dataclass(frozen=True)
class ListedLog:
    """A log to read: its name, the file it leads to (a link below a folder: its target), and
    for a file found below a folder the (device, inode) listed, which the one opening must find
    again (common.open_log)."""

    path: Path
    target: Path
    identity: tuple[int, int] | None = None


def log_files(paths: list[str | Path],
              any_owner: bool = False) -> tuple[list[ListedLog], list[str]]:
    """The files to read, and one line for each file of a folder that is not read.

    A file named on the command line is read: the user asked for it. Below a folder, a
    symbolic link that leads out of the folder is not followed (a link to ``/etc/shadow`` or
    to a colleague's private log would put that file's lines into a shared database), and a
    file owned by another user is read only with ``any_owner`` (``--any-owner``): whoever
    collects a shared folder decides to store other people's logs, it does not happen by
    accident."""
    out: list[ListedLog] = []
    skipped: list[str] = []
    me = os.geteuid()
    for p in map(Path, paths):
        if p.is_dir():
            root = p.resolve()
            for dirpath, dirnames, filenames in os.walk(p, followlinks=False):
                dirnames.sort()
                for name in sorted(filenames) + [d for d in dirnames
                                                 if Path(dirpath, d).is_symlink()]:
                    f = Path(dirpath, name)
                    listed = _listed(f, root, me, any_owner)
                    if isinstance(listed, str):
                        skipped.append(f"{f}: {listed}")
                    elif listed is not None:
                        out.append(listed)
        elif p.exists():
            out.append(ListedLog(p, p))
        else:
            raise UserError(f"collect --from-logs: {p} does not exist")
    return out, skipped


def _listed(f: Path, root: Path, me: int, any_owner: bool) -> ListedLog | str | None:
    """The file found below ``root`` to read, why it is not read, or None (not a file: a
    FIFO, a socket). Its (device, inode) binds the check made here to the one opening."""
    target = f.resolve()
    link = f.is_symlink()
    if link and not target.is_relative_to(root):
        return "a link out of the folder, not followed"
    try:
        st = os.lstat(target)
    except OSError:
        return "cannot be read"
    if link and stat.S_ISDIR(st.st_mode):
        return "a link to a folder, not followed"
    if not stat.S_ISREG(st.st_mode):
        return None
    if st.st_uid != me and not any_owner:
        return f"owned by another user (uid {st.st_uid}): --any-owner reads it"
    return ListedLog(f, target if link else f, (st.st_dev, st.st_ino))
