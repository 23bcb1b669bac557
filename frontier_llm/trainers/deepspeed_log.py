"""DeepSpeed logs (a training script driving ``deepspeed.initialize``'s engine).

What is read (docs/trainer-logs.md): ``DeepSpeed info: version=...``, the engine's configuration
block (``DeepSpeedEngine configuration:`` then ``  name ..... value``: ``train_batch_size``,
``train_micro_batch_size_per_gpu``, ``zero_optimization_stage``, ``bfloat16_enabled``,
``fp16_enabled``), the optimizer-step lines ``[Rank 0] step=N, skipped=K, lr=[...], mom=[...]``,
the throughput timer lines that follow them (``timer.py ... stop] E/N, SamplesPerSec=S,
MemAllocated=..GB, MaxMemAllocated=M GB``, or the newer ``epoch=E/micro_step=U/global_step=N,
RunningAvgSamplesPerSec=..., CurrSamplesPerSec=S, MemAllocated=..., MaxMemAllocated=M``), and
out-of-memory and error lines. DeepSpeed prints no loss and no model shape: ``--model`` gives the
shape; the step time is the global batch over the samples per second the timer printed.
"""

from __future__ import annotations

import re

from frontier_llm.specs.layout import Layout
from frontier_llm.specs.model import ModelSpec
from frontier_llm.trainers.deepspeed_config import PRINTED_AS
from frontier_llm.trainers.log_reader import (
    LogReader,
    ParsedRun,
    Step,
    flag,
    integer,
    loss_number,
    number,
    read_memory_report,
    read_outcome,
)

_STEP = re.compile(r"\[Rank \d+\] step=(\d+), skipped=(\d+)")
_TIMER_OLD = re.compile(r"\] \d+/(\d+), SamplesPerSec=([\d.eE+-]+)(.*)")
_TIMER_NEW = re.compile(r"global_step=(\d+), .*?CurrSamplesPerSec=([\d.eE+-]+)(.*)")
_MAX_MEM = re.compile(r"MaxMemAllocated=([\d.]+)\s*GB")
_VERSION = re.compile(r"DeepSpeed info: version=([^\s,]+)")
_CONFIG = re.compile(r"\[config\.py:\d+:print\]\s+(\w+)\s+\.*\s*(.*?)\s*$")
_PIPE = re.compile(r"^steps: (\d+) loss: (\S+) iter time \(s\): ([\d.]+) samples/sec: ([\d.]+)")

_AUTOTP = re.compile(r"\bautotp_size=(\d+)")
GB = 2**30  # DeepSpeed's "GB" is bytes / 1024**3 (see_memory_usage / ThroughputTimer)


class DeepSpeedLog(LogReader):
    name = "deepspeed"
    title = "DeepSpeed"
    start = re.compile(r"DeepSpeed info: version=|DeepSpeedEngine configuration:")
    # Its configuration block states batches, ZeRO stage, precision and AutoTP's size; the
    # pipeline, the data-parallel size and the rest are the training script's.
    unstated = ("dp", "pp", "cp", "ep", "virtual_stages", "sequence_parallel", "recompute", "tp",
                "first_stage_layers", "last_stage_layers", "etp")
    signature = re.compile(r"\[Rank \d+\] step=\d+, skipped=|SamplesPerSec=|DeepSpeed info: "
                           r"version=|DeepSpeedEngine configuration:"
                           r"|iter time \(s\): .* samples/sec")

    def read(self, run: ParsedRun, text: str) -> bool | None:
        if "DeepSpeedEngine configuration:" in text:
            return True
        if m := _VERSION.search(text):
            run.version = f"deepspeed {m.group(1)}"
            return True
        if m := _CONFIG.search(text):
            run.args.setdefault(m.group(1), m.group(2))
            return True
        if m := _PIPE.search(text):  # the pipeline engine prints the step time itself
            try:
                run.add_step(Step(int(m.group(1)), number(m.group(3)),
                                  loss=loss_number(m.group(2))))
            except ValueError:
                return False
            return True
        if read_memory_report(run, text):
            return True
        if m := _STEP.search(text):
            run.args["last_step"] = m.group(1)
            return True
        if m := _TIMER_NEW.search(text) or _TIMER_OLD.search(text):
            return self._timer(run, m)
        if "SamplesPerSec" in text:
            return False
        return True if read_outcome(run, text) else None

    def _timer(self, run: ParsedRun, m: re.Match) -> bool:
        try:
            step = Step(int(m.group(1)), 0.0)
            # Samples per second until the layout says the batch: turned into a step time
            # by the trace builder (global batch / samples per second).
            step.tokens_per_s = None
            run.args[f"sps.{step.step}"] = str(number(m.group(2)))
            if mem := _MAX_MEM.search(m.group(3)):
                step.memory_bytes = int(number(mem.group(1)) * GB)
        except ValueError:
            return False
        run.add_step(step)
        return True

    def finish(self, run: ParsedRun) -> None:
        a = run.args
        for field in ("global_batch", "micro_batch"):
            if (value := integer(a.get(PRINTED_AS[field]))) is not None:
                run.layout[field] = value
        if (zero := integer(a.get(PRINTED_AS["sharding"]))) is not None:
            run.layout["sharding"] = f"zero{zero}"
        # AutoTP's size; 0 is no AutoTP, where tp is the script's (a pipeline's own layers).
        if (tp := _AUTOTP.search(a.get(PRINTED_AS["tp"], ""))) is not None and int(tp.group(1)):
            run.layout["tp"] = int(tp.group(1))
        # DeepSpeed 0.19 prints its precision blocks ("enabled=True ..."), older ones a
        # bfloat16_enabled / fp16_enabled flag.
        if _enabled(a.get(PRINTED_AS["bf16"])) or flag(a.get("bfloat16_enabled")):
            run.layout["dtype"] = "bf16"
        elif _enabled(a.get(PRINTED_AS["fp16"])) or flag(a.get("fp16_enabled")):
            run.layout["dtype"] = "fp16"
        run.layout["engine"] = "deepspeed"

    def step_times(self, run: ParsedRun, layout: Layout, model: ModelSpec) -> None:
        """The step time is the global batch over the samples per second the timer printed."""
        for s in run.steps:
            if not s.time_s and (sps := samples_per_s(run, s.step)):
                s.time_s = layout.global_batch / sps


def _enabled(printed: str | None) -> bool:
    return bool(printed) and re.match(r"enabled=True\b", printed.strip()) is not None


def samples_per_s(run: ParsedRun, step: int) -> float | None:
    """What the throughput timer printed at ``step``."""
    value = run.args.get(f"sps.{step}")
    return float(value) if value is not None else None
