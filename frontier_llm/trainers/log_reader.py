"""What every trainer's log parser shares: reading a log file, rank prefixes, runs, the warm-up
rule and the one-line refusals (docs/trainer-logs.md).

A reader (``megatron``, ``torchtitan``, ``deepspeed``) is a :class:`LogReader`, owned by its
trainer's object in the registry (``trainers/__init__.py``, ``Trainer.log_reader``): it says which
lines start a run and reads each line into the current :class:`ParsedRun`, through its trainer's
vocabulary (the same table its exporter writes flags with). This module walks the
file, strips ``srun --label`` (``0: ``) and torchrun (``[rank0]:``) prefixes, splits the file
into runs and counts the lines that look like the trainer's step lines but cannot be read.
"""

from __future__ import annotations

import errno
import gzip
import os
import re
import stat
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from frontier_llm.errors import SpecError, UserError
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.numbers import parse_integer, parse_real

# The warm-up rule (docs/trainer-logs.md): the first logged step of a run, and every step whose
# number is at most WARMUP_STEPS, are warm-up. The first steps of any trainer pay for memory
# allocation, kernel selection, compilation and the first data loads; Megatron's first logged
# interval also averages over them.
WARMUP_STEPS = 2
# The largest log read: a log of a million Megatron iterations is about 400 MB; above this a
# path is more likely a checkpoint or a core file than a log.
MAX_LOG_BYTES = 1 << 30
# The longest line read. Megatron's iteration line is about 500 characters, its longest
# argument lines (a data path list) a few KiB, a torchtitan job config dump is one key a line;
# a longer "line" is not one a trainer prints for flm to read, and reading it whole would cost
# its size in memory (a 1 GB file with no newline). Skipped and counted instead.
MAX_LINE_BYTES = 64 << 10
# How much of a log's start is kept to name the trainer that wrote it when it is not this one.
HEAD_BYTES = 64 << 10
_PREFIXES = (
    re.compile(r"^\s*(\d+):\s?"),  # srun --label
    re.compile(r"^\[rank(\d+)\]:\s?"),  # torchrun --tee / --local-ranks-filter
    re.compile(r"^\[default(\d+)\]:\s?"),  # torchrun's older log prefix
)
_STAMP = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})")


class LogError(UserError):
    """A log refused as a whole (not a text file, not this trainer's log, unreadable)."""


@dataclass
class Step:
    """One logged step: its number and what the line printed (None where it printed nothing)."""

    step: int
    time_s: float
    loss: float | None = None
    tflops: float | None = None  # model TFLOP/s per GPU as the trainer printed it
    tokens_per_s: float | None = None  # per GPU where the trainer prints it so
    mfu: float | None = None
    memory_bytes: int | None = None
    global_batch: int | None = None  # the batch the step ran, where its line prints it
    # The router's load-balancing loss (Mixture-of-Experts) averaged over MoE blocks, where the
    # trainer prints it (Megatron-LM's "load_balancing_loss").
    load_balancing_loss: float | None = None


@dataclass
class ParsedRun:
    """One run of a log as the trainer printed it; nothing here is guessed."""

    trainer: str
    index: int  # the run's position in its file, from 0
    args: dict[str, str] = field(default_factory=dict)  # the printed arguments / config
    layout: dict[str, object] = field(default_factory=dict)  # layout fields the log states
    model: dict[str, object] = field(default_factory=dict)  # model shape fields it states
    model_name: str | None = None  # a name the log prints (torchtitan's flavour), if any
    world_size: int | None = None
    version: str | None = None
    total_steps: int | None = None
    steps: list[Step] = field(default_factory=list)
    seen_steps: set[int] = field(default_factory=set)
    status: str | None = None  # oom / failed when the log says so
    error: str | None = None
    error_after: int = 0  # how many steps the run had printed when its error line came
    finished: bool = False  # the trainer printed its end-of-training line
    in_block: bool = False  # inside a printed arguments / config block
    first_time: str | None = None
    last_time: str | None = None

    def add_step(self, step: Step) -> None:
        """Keep the first line of each step (other ranks print the same step again)."""
        if step.step in self.seen_steps:
            return
        self.seen_steps.add(step.step)
        self.steps.append(step)

    @property
    def has_content(self) -> bool:
        return bool(self.steps or self.args or self.layout)

    def warmup(self) -> list[bool]:
        """Which steps are warm-up, by the rule above (WARMUP_STEPS)."""
        return [i == 0 or s.step <= WARMUP_STEPS for i, s in enumerate(self.steps)]


@dataclass
class ParsedLog:
    """A file's runs and what could not be read in it."""

    path: Path
    runs: list[ParsedRun]
    lines: int = 0
    unreadable: int = 0  # lines that look like step lines but could not be read
    long_lines: int = 0  # lines longer than MAX_LINE_BYTES, skipped unread


class LogReader:
    """One trainer's log format; subclasses fill in the regular expressions and ``read``."""

    name = ""
    title = ""
    # A line that starts a new run when the current one already holds steps.
    start: re.Pattern = re.compile(r"(?!)")
    # A line that only this trainer prints (to tell its logs from others').
    signature: re.Pattern = re.compile(r"(?!)")
    # Layout fields its logs never state: they come from --layout (docs/trainer-logs.md).
    unstated: tuple[str, ...] = ()

    def read(self, run: ParsedRun, text: str) -> bool | None:
        """Read one line (prefix stripped) into ``run``: True when understood, False when it
        looked like a step line and could not be read, None when it is not for this parser."""
        raise NotImplementedError

    def finish(self, run: ParsedRun) -> None:
        """Turn what the run printed (``run.args``) into layout and model fields."""

    def step_times(self, run: ParsedRun, layout: Layout, model: ModelSpec) -> None:
        """Fill in the step times a log gives as a rate (``Step.time_s`` 0) once the layout
        and model are known; a trainer that prints its step time needs nothing here."""


def strip_prefix(line: str) -> tuple[int | None, str]:
    """(rank, the line without its launcher prefix); rank None when there was none."""
    for pattern in _PREFIXES:
        m = pattern.match(line)
        if m:
            return int(m.group(1)), line[m.end():]
    return None, line


def read_text(path: Path) -> str:
    """The whole log as text (small files, tests); ``parse_log`` streams with
    :func:`read_lines` instead. LogError (one line) as :func:`read_lines` says."""
    return "\n".join(read_lines(path))


class LogLines:
    """A log's lines, read one at a time so that memory stays bounded whatever the file holds.

    A line longer than MAX_LINE_BYTES (a minified JSON blob, a progress bar without newlines,
    a 1 GB file with no newline at all) is skipped unread past the cap and counted in
    ``long_lines``: no trainer prints a step, argument or error line anywhere near that long.
    ``head`` keeps the first HEAD_BYTES of text, to say which other trainer wrote a log.
    """

    def __init__(self, path: Path, identity: tuple[int, int] | None = None) -> None:
        self.path = path
        self.long_lines = 0
        self.head = ""
        self._file = _gunzipped(open_log(path, identity))
        try:
            _check_text(path, self._file.read(HEAD_BYTES))
            self._file.seek(0)
        except BaseException:
            self._file.close()
            raise

    def __iter__(self) -> Iterator[str]:
        with self._file as f:
            kept = 0
            while raw := f.readline(MAX_LINE_BYTES + 1):
                if f.tell() > MAX_LOG_BYTES:  # a gzipped log's text, past the plain limit
                    raise LogError(f"{self.path}: more than {MAX_LOG_BYTES >> 20} MiB of text "
                                   "uncompressed; not a training log")
                if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                    self.long_lines += 1
                    while raw and not raw.endswith(b"\n"):  # drop the rest, a chunk at a time
                        raw = f.readline(MAX_LINE_BYTES)
                    continue
                line = raw.decode("utf-8", errors="replace").rstrip("\n").rstrip("\r")
                if kept < HEAD_BYTES:
                    self.head += line + "\n"
                    kept += len(raw)
                yield line


def read_lines(path: Path, identity: tuple[int, int] | None = None) -> LogLines:
    """The log's lines, streamed; LogError (one line) for a folder, a binary file or a file
    larger than MAX_LOG_BYTES (``identity``: see :func:`open_log`)."""
    return LogLines(path, identity)


def open_log(path: Path, identity: tuple[int, int] | None = None):
    """The log opened once, its checks made on the open descriptor (fstat), never on the path
    again: a file checked and then opened by name can be swapped for a link in between.

    ``identity`` (device, inode), for a file found below a folder: the file must still be the
    one listed, and its last component is not followed if it became a link (O_NOFOLLOW); a
    folder of the path swapped for a link leads to another inode and is refused too."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO does not hang
    if identity is not None:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and identity is not None:
            raise LogError(f"{path}: became a link after the folder was listed; not "
                           "followed") from None
        raise LogError(f"{path}: cannot be read ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LogError(f"{path}: not a file")
        if identity is not None and (st.st_dev, st.st_ino) != identity:
            raise LogError(f"{path}: replaced after the folder was listed; not read")
        if st.st_size > MAX_LOG_BYTES:
            raise LogError(f"{path}: larger than {MAX_LOG_BYTES >> 20} MiB; not a training log")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


# Logs are often kept gzipped (log rotation, archived job folders): read through, as text.
GZIP_MAGIC = b"\x1f\x8b"


class _Gunzip(gzip.GzipFile):
    """A gzipped log's text; a cut or corrupt stream is a LogError (one line), not a crash."""

    def _damaged(self) -> LogError:
        return LogError(f"{self.name}: a damaged gzip file, not a readable training log")

    def read(self, size: int | None = -1) -> bytes:
        try:
            return super().read(size)
        except (OSError, EOFError, zlib.error):
            raise self._damaged() from None

    def readline(self, size: int | None = -1) -> bytes:
        try:
            return super().readline(size)
        except (OSError, EOFError, zlib.error):
            raise self._damaged() from None


def _gunzipped(raw: BinaryIO) -> BinaryIO:
    """The file, or its decompressed stream when it is gzip (its first bytes say so)."""
    gzipped = raw.read(2) == GZIP_MAGIC
    raw.seek(0)
    return _Gunzip(fileobj=raw, mode="rb") if gzipped else raw  # type: ignore[return-value]


def _check_text(path: Path, head: bytes) -> None:
    if b"\x00" in head:
        raise LogError(f"{path}: a binary file, not a training log")
    text = head.decode("utf-8", errors="replace")
    if head and text.count("\ufffd") > len(head) // 100:
        raise LogError(f"{path}: not UTF-8 text (a binary file?), not a training log")


def parse_text(trainer: LogReader, text: str | Iterable[str], path: Path,
               others: Iterable[LogReader] = ()) -> ParsedLog:
    """Split the log (its text, or its lines as :func:`read_lines` streams them) into runs and
    read each line with ``trainer``; ``others`` (the other trainers' readers) name the trainer
    of a log that is not this one's."""
    lines = text.splitlines() if isinstance(text, str) else text
    runs = [ParsedRun(trainer.name, 0)]
    log = ParsedLog(path, runs)
    recognised = False
    for raw in lines:
        log.lines += 1
        _, line = strip_prefix(raw.rstrip("\r"))
        if trainer.signature.search(line):
            recognised = True
        if trainer.start.search(line) and runs[-1].steps:
            runs.append(ParsedRun(trainer.name, len(runs)))
        run = runs[-1]
        result = trainer.read(run, line)
        # A step line that cannot be read, or a line with bytes that are not UTF-8 (garbled).
        if result is False or "\ufffd" in line:
            log.unreadable += 1
        if result:
            stamp = _STAMP.search(line)
            if stamp:
                when = f"{stamp.group(1)}T{stamp.group(2)}+00:00"
                run.first_time = run.first_time or when
                run.last_time = when
    if isinstance(lines, LogLines):
        log.long_lines = lines.long_lines
    if not recognised:
        head = text if isinstance(text, str) else getattr(lines, "head", "")
        raise LogError(f"{path}: no {trainer.title} line in it; not a {trainer.title} log "
                       f"{_other_trainer(head, trainer, others)}".rstrip())
    log.runs = [r for r in runs if r.has_content]
    for run in log.runs:
        trainer.finish(run)
    return log


def _other_trainer(text: str, trainer: LogReader, others: Iterable[LogReader]) -> str:
    for other in others:
        if other.name != trainer.name and other.signature.search(text):
            return f"(it looks like a {other.title} log: --trainer {other.name})"
    return ""


class BadNumber(LogError, ValueError):
    """A number of a log that is none (``inf``, ``nan``, 40 digits, a negative count): a step
    line that holds one is unreadable (the parsers catch ValueError), an argument refuses the
    file (LogError), in one line either way (specs/numbers.py)."""


def number(text: str, field: str = "a number of the log") -> float:
    """A printed number: ``10,050`` (torchtitan's thousands), ``1.8E+00``, ``243.6``; NaN, an
    infinity or a magnitude beyond any run's refused (specs/numbers.py)."""
    try:
        return parse_real(text, field)
    except SpecError as exc:
        raise BadNumber(str(exc)) from None


def loss_number(text: str) -> float:
    """A printed loss: ``nan`` and ``inf`` are kept, a diverged run's real measurement."""
    if text.strip().lower() in ("nan", "inf", "-inf", "+inf"):
        return float(text.strip())
    return number(text, "a loss")


_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|HIP out of memory|out of memory\b", re.I)
_ERROR = re.compile(r"^(?:[\w.]+)?(?:Error|Exception)\b[^:]*:\s*\S|^Traceback \(most recent")
_ARG = re.compile(r"^\s+(\w+)\s\.{2,}\s?(.*?)\s*$")


def read_outcome(run: ParsedRun, text: str) -> bool:
    """Note an out-of-memory or error line (the first one is the run's error)."""
    if _OOM.search(text):
        if run.status != "oom":
            run.status, run.error = "oom", text.strip()[:500]
        run.error_after = len(run.steps)
        return True
    if _ERROR.search(text.strip()):
        if run.status is None:
            run.status = "failed"
        if run.error is None or run.error.startswith("Traceback"):
            run.error = text.strip()[:500]
        run.error_after = len(run.steps)
        return True
    return False


def read_dotted(run: ParsedRun, text: str) -> bool:
    """``  name ........ value``, the way Megatron prints its arguments and DeepSpeed its
    configuration; only inside such a block."""
    m = _ARG.match(text)
    if not (run.in_block and m):
        return False
    run.args.setdefault(m.group(1), m.group(2))
    return True


def flag(text: str | None) -> bool | None:
    """A printed boolean (True/False/true/false), None when not printed or ``None``."""
    if text is None or text == "None":
        return None
    return text.strip().lower() in ("true", "1", "yes")


def integer(text: str | None, field: str = "a count of the log") -> int | None:
    """A printed count (``1,024``, ``8``), or None when not printed; NaN, an infinity, a
    fraction, a negative or a count beyond int32 refused (specs/numbers.py)."""
    if text is None or text.strip() in ("None", ""):
        return None
    try:
        return parse_integer(text, field)
    except SpecError as exc:
        raise BadNumber(str(exc)) from None


_REPORT = re.compile(r"\(?after \d+ iterations\)? memory \(MB\).*\| max allocated: ([\d.]+)")
MB = 2**20


def read_memory_report(run: ParsedRun, text: str) -> bool:
    """Megatron's ``report_memory`` line (``[Rank R] (after N iterations) memory (MB) | ... |
    max allocated: X``): the peak over ranks, on the run's latest step."""
    m = _REPORT.search(text)
    if not m:
        return False
    if run.steps:
        last = run.steps[-1]
        last.memory_bytes = max(last.memory_bytes or 0, int(number(m.group(1)) * MB))
    return True


def keep_batch(run: ParsedRun) -> None:
    """The global batch the step lines print is the run's batch (what ran; an arguments block
    states the ramp-up's target, which a short run may not reach). A batch ramp-up (Megatron's
    ``--rampup-batch-size``) runs steps at smaller batches first; only the steps at the run's
    final batch measure its layout, so the others are dropped and ``batch_rampup_steps`` says
    how many."""
    printed = [s.global_batch for s in run.steps if s.global_batch is not None]
    if not printed:
        return
    final = printed[-1]
    run.layout["global_batch"] = final
    kept = [s for s in run.steps if s.global_batch in (None, final)]
    if len(kept) < len(run.steps):
        run.args["batch_rampup_steps"] = str(len(run.steps) - len(kept))
        run.steps = kept
