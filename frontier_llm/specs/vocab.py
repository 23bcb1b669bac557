"""The project's vocabularies, one module: the layout's words (schedule, recompute, precision,
engine, placement) and the outcomes of runs and jobs.

A vocabulary is a ``StrEnum``: a member *is* its text (``Schedule.GPIPE == "gpipe"``), and its
position in the class is its numpy code (``Recompute.FULL.code == 2``), so formulas compare with
``Recompute.FULL.code``, never with a bare integer. Never reorder members; append.
"""

from __future__ import annotations

from enum import StrEnum
from functools import cache
from typing import Any

from frontier_llm.errors import SpecError


class Vocabulary(StrEnum):
    """A closed set of words; the member order is the numpy code (never reorder, only append)."""

    @property
    def code(self) -> int:
        """This member's position: its code in numpy columns and formulas."""
        return _code(type(self), self)

    @classmethod
    def words(cls) -> tuple[str, ...]:
        """The members' texts in code order (CLI ``choices``, schema ``enum``, categories)."""
        return tuple(m.value for m in _members(cls))

    @classmethod
    def from_code(cls, code: int):
        return _members(cls)[int(code)]

    @classmethod
    def parse(cls, value: Any, name: str):
        """The member for ``value`` (a member or its text); SpecError naming the field."""
        try:
            return cls(value)
        except ValueError:
            raise SpecError(f"{name} must be one of {', '.join(cls.words())} (got {value!r})",
                            name) from None


@cache
def _members(cls: type[Vocabulary]) -> tuple:
    return tuple(cls)


@cache
def _code(cls: type[Vocabulary], member: Vocabulary) -> int:
    # Keyed by class too: members of two vocabularies may share a word ("full") and a hash.
    return _members(cls).index(member)


class Schedule(Vocabulary):
    """Pipeline schedule (Narayanan et al. 2021)."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"


class Recompute(Vocabulary):
    """Activation recomputation. ``selective`` and ``full`` are Korthikanti et al. 2022's
    (the attention core, the whole block); ``selective-op`` is PyTorch's op-level selective
    activation checkpointing as torchtitan applies it (``mode = 'selective'``,
    ``selective_ac_option = 'op'``): each block keeps the outputs of its 1st, 3rd, 5th, ...
    matrix multiply and of the attention kernel and recomputes everything else."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"
    SELECTIVE_OP = "selective-op"


class DType(Vocabulary):
    """Training precision."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    # 16-bit training whose linear layers' GEMMs run in 8-bit floats (E4M3 forward, E5M2
    # gradients: Micikevicius et al. 2022, "FP8 Formats for Deep Learning"), scaled as the
    # layout's ``fp8_recipe`` says; everything else (attention, norms, router, loss, optimizer)
    # stays bf16/fp32 (costmodel/fp8.py).
    FP8 = "fp8"


class FP8Recipe(Vocabulary):
    """How FP8 tensors are scaled (read only with dtype fp8; costmodel/fp8.py):
    ``tensorwise``: one scale per tensor from its current amax (torchao's default
    ``tensorwise`` recipe; TransformerEngine's ``Float8CurrentScaling``; Megatron-LM
    ``--fp8-recipe tensorwise``); ``delayed``: one scale per tensor from an amax history
    (TransformerEngine's ``DelayedScaling``, Megatron-LM's default ``delayed``);
    ``blockwise``: 1x128 tiles of activations and gradients, 128x128 blocks of weights
    (DeepSeek-V3 §3.3, arXiv 2412.19437; TransformerEngine's ``Float8BlockScaling``,
    Megatron-LM ``--fp8-recipe blockwise``); ``mxfp8``: OCP microscaling, one E8M0 scale per 32
    elements, in the tensor cores of Blackwell and CDNA4 (MI355X) only."""

    TENSORWISE = "tensorwise"
    DELAYED = "delayed"
    BLOCKWISE = "blockwise"
    MXFP8 = "mxfp8"


class Engine(Vocabulary):
    """The training engine that runs a layout (its rules: ``specs/engine_rules.py``)."""

    NATIVE = "native"
    MEGATRON = "megatron"
    DEEPSPEED = "deepspeed"


class PlacementKind(Vocabulary):
    """How one model-state component is spread over the DP ranks (AMSP)."""

    REPLICATE = "replicate"
    FULL = "full"
    PARTIAL = "partial"


class RunStatus(Vocabulary):
    """How one ``flm bench`` run ended, as its trace says (trace_schema.json's ``status``)."""

    COMPLETED = "completed"
    # Completed, but a check (loss, timing) flagged it: counted as measured.
    SUSPECT = "suspect"
    OOM = "oom"
    FAILED = "failed"
    TIMEOUT = "timeout"

    @property
    def measured(self) -> bool:
        """The run's figures are a measurement (completed, or completed and flagged)."""
        return self in (RunStatus.COMPLETED, RunStatus.SUSPECT)

    @property
    def job_state(self) -> JobState:
        """The verdict of the job whose trace ends so (jobs/classify.py starts from it)."""
        return _RUN_TO_JOB[self]


class JobState(StrEnum):
    """A job row's state (jobs/lifecycle.py tells its life). Values are the words stored in
    the database and shown to users."""

    RENDERED = "RENDERED"  # script written, not submitted
    SUBMITTING = "SUBMITTING"  # intent recorded before sbatch (crash-safe resume, state.py)
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    HUNG = "HUNG"  # running, but its heartbeat stopped; still holds the machine
    COMPLETED = "COMPLETED"
    OOM = "OOM"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"  # a higher-priority job took its nodes
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"  # the executor could not tell; asked again at the next refresh
    LOST = "LOST"  # the scheduler forgot it and its files say nothing final; retry reruns it

    @property
    def terminal(self) -> bool:
        """The job will not run again unless retried."""
        return self in _TERMINAL

    @property
    def active(self) -> bool:
        """Submitted and not ended: a refresh asks the executor about it."""
        return self in _ACTIVE

    @property
    def retryable(self) -> bool:
        """``flm sweep retry --failed-only`` resubmits it (a completed job never re-runs)."""
        return self in _RETRYABLE


_TERMINAL = frozenset({JobState.COMPLETED, JobState.OOM, JobState.TIMEOUT, JobState.NODE_FAIL,
                       JobState.PREEMPTED, JobState.CANCELLED, JobState.FAILED, JobState.LOST})
_ACTIVE = frozenset({JobState.PENDING, JobState.RUNNING, JobState.HUNG, JobState.UNKNOWN})
_RETRYABLE = frozenset({JobState.OOM, JobState.TIMEOUT, JobState.NODE_FAIL, JobState.PREEMPTED,
                        JobState.CANCELLED,
                        JobState.FAILED, JobState.HUNG, JobState.LOST})


_RUN_TO_JOB = {RunStatus.COMPLETED: JobState.COMPLETED, RunStatus.SUSPECT: JobState.COMPLETED,
               RunStatus.OOM: JobState.OOM, RunStatus.FAILED: JobState.FAILED,
               RunStatus.TIMEOUT: JobState.TIMEOUT}
