"""Which layouts a DualPipe run (``--moe-overlap dualpipe``, :class:`~frontier_llm.costmodel.moe.
MoeRun`) can be: the planner's rejections and ``flm predict``'s refusal share these rules.

DualPipe replaces the pipeline schedule (steptime.stage_times prices DualPipe's pace and bubble
whatever the layout's ``schedule`` says), so a layout's schedule label is not a choice under it:
the same run listed as gpipe, 1f1b and interleaved would be one run under three names. It is
stated as ``1f1b``, as the DeepSeek-V3 calibration row (calibration_runs_moe.csv, row 2) resolves
and as docs/costmodel.md compares it (DualPipe's bubble and activations against 1F1B's).

- pp even and at least 2: deepseek-ai/DualPipe dualpipe/dualpipe.py
  (@bb214e82b5933d4cf4249eb76c27076428061c7c), ``DualPipe.step``: ``assert num_ranks % 2 == 0``
  (rank ``r`` pairs with ``P−1−r``; pp 1 is odd and has no pipeline to run in two directions).
- the engine: Megatron-LM layouts only. No engine flm drives runs DualPipe (it is DeepSeek's own
  schedule in HAI-LLM; Megatron-LM, torchtitan and DeepSpeed have no such flag, and flm bench's
  native engine runs GPipe/1F1B/interleaved only); the DeepSeek-V3 row is stated as a Megatron
  layout (no tp, ZeRO-1 as a distributed optimizer, ep over dp), as ``ep-a2a`` is priced on
  Megatron-LM layouts only. flm's Megatron-LM export writes the layout's 1F1B schedule, not
  DualPipe: the plan says so (cli/plan.py ``dualpipe_note``).
"""

from __future__ import annotations

import numpy as np

from frontier_llm.errors import UserError
from frontier_llm.specs.layout import Engine, Schedule

# The schedule label and the engines a DualPipe layout is stated with.
DUALPIPE_SCHEDULE = Schedule.ONE_F_ONE_B
DUALPIPE_ENGINES = (Engine.MEGATRON,)
# The rules, in the order they are checked (the first broken one is the reason given).
DUALPIPE_REASONS = (
    "DualPipe needs an even pp of 2 or more (dualpipe.py asserts num_ranks % 2 == 0)",
    "DualPipe replaces the pipeline schedule: its layouts are stated as 1f1b",
    "DualPipe is priced on Megatron-LM layouts only",
)


def dualpipe_codes(pp, schedule, engine) -> np.ndarray:
    """Per layout, 1 + the index in :data:`DUALPIPE_REASONS` of the first rule it breaks, 0
    for none. ``schedule`` and ``engine``: the layout table's codes."""
    pp = np.asarray(pp)
    broken = (
        (pp < 2) | (pp % 2 != 0),
        np.asarray(schedule) != DUALPIPE_SCHEDULE.code,
        ~np.isin(np.asarray(engine), [e.code for e in DUALPIPE_ENGINES]),
    )
    out = np.zeros(pp.shape, dtype=np.int16)
    for i, mask in reversed(list(enumerate(broken, start=1))):  # the first rule broken wins
        out[mask] = i
    return out


def check_dualpipe(pp: int, schedule: Schedule, engine: Engine) -> None:
    """Refuse a layout DualPipe cannot run (``flm predict --moe-overlap dualpipe``), with the
    first rule it breaks."""
    code = int(dualpipe_codes(pp, schedule.code, engine.code))
    if code:
        raise UserError(f"--moe-overlap dualpipe: {DUALPIPE_REASONS[code - 1]} (this layout: "
                        f"pp {pp}, {schedule.value}, {engine.value})")
