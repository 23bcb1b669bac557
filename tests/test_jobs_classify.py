"""The classifier: one verdict from scheduler state, exit code, log, trace and heartbeat.

The inputs here are the strings SLURM and flm bench really produce (see test_sweep_slurm.py for
the same verdicts reached end to end on the real SLURM)."""

from __future__ import annotations

import os
import time

import pytest

from frontier_llm.bench.peer_errors import is_collateral
from frontier_llm.bench.trace import write_heartbeat
from frontier_llm.jobs.classify import (
    classify,
    exit_status,
    failure_reason,
    first_error_line,
    heartbeat_age,
    load_trace,
)
from frontier_llm.jobs.executors import array_spec, time_limit_s
from frontier_llm.jobs.lifecycle import JobState, Observation, SchedulerState
from frontier_llm.jobs.slurm import JobStatus

CANCELLED, COMPLETED, FAILED, HUNG, NODE_FAIL, OOM, PENDING, RUNNING, TIMEOUT = (
    JobState.CANCELLED, JobState.COMPLETED, JobState.FAILED, JobState.HUNG, JobState.NODE_FAIL,
    JobState.OOM, JobState.PENDING, JobState.RUNNING, JobState.TIMEOUT)


def seen(word: str, code: str | None = None) -> Observation:
    """What an executor reports for SLURM's state ``word`` (through slurm.py's mapping), or for
    a local process that ended (EXITED)."""
    if word == "EXITED":
        return Observation(SchedulerState.EXITED, code)
    return JobStatus("1", word, exit_code=code).observation()

TRACEBACK = """flm: task 0 job crash-error run crash-error-j12 on vm
flm bench: injected crash on rank 1 at step 1
Traceback (most recent call last):
  File "run.py", line 244, in main
    _inject(cfg.fault, rank, step)
RuntimeError: injected crash at step 1 on rank 1
srun: error: vm: task 1: Exited with exit code 1
"""


@pytest.mark.parametrize("state,code,trace,log,expected,reason", [
    ("COMPLETED", "0:0", {"status": "completed", "error": None}, "", COMPLETED, None),
    ("COMPLETED", "0:0", None, "", FAILED, "exit 0 but no valid trace"),
    ("FAILED", "3:0", {"status": "oom", "error": "MemoryError: rank 0"}, "", OOM,
     "MemoryError: rank 0"),
    ("FAILED", "3:0", None, "", OOM, "out of memory"),
    ("OUT_OF_MEMORY", "0:125", None, "", OOM, "out of memory"),
    ("TIMEOUT", "0:0", None, "", TIMEOUT, "time limit reached"),
    ("CANCELLED", "0:15", None, "slurmstepd: *** JOB 5 CANCELLED AT x DUE TO TIME LIMIT ***",
     TIMEOUT, "time limit reached"),
    ("CANCELLED by 0", "0:15", None, "", CANCELLED, "SLURM state CANCELLED"),
    ("NODE_FAIL", "0:0", None, "", NODE_FAIL, "SLURM state NODE_FAIL"),
    ("FAILED", "1:0", None, TRACEBACK, FAILED, "flm bench: injected crash on rank 1 at step 1"),
    ("FAILED", "1:0", {"status": "failed", "error": "ValueError: bad"}, "", FAILED,
     "ValueError: bad"),
    ("FAILED", "1:0", {"status": "failed", "error": "ValueError: bad"}, TRACEBACK, FAILED,
     "flm bench: injected crash on rank 1 at step 1"),
    ("FAILED", "42:0", None, "", FAILED, "exit code 42"),
    ("FAILED", "0:9", None, "", FAILED, "signal 9"),
    ("EXITED", "0:0", {"status": "completed", "error": None}, "", COMPLETED, None),
    ("EXITED", None, {"status": "completed", "error": None}, "", COMPLETED, None),
    ("PENDING", None, None, "", PENDING, None),
    ("RUNNING", None, None, "", RUNNING, None),
])
def test_verdicts(state, code, trace, log, expected, reason):
    verdict = classify(seen(state, code), trace=trace, log_text=log)
    assert (verdict.state, verdict.reason) == (expected, reason)


def test_hung_from_heartbeat_age_and_from_a_missing_first_heartbeat():
    assert classify(seen("RUNNING"), heartbeat_age_s=700, hung_after_s=600).state == HUNG
    assert classify(seen("RUNNING"), heartbeat_age_s=10, hung_after_s=600).state == RUNNING
    late = classify(seen("RUNNING"), running_for_s=900, hung_after_s=600)
    assert late.state == HUNG and "first heartbeat" in late.reason
    assert classify(seen("RUNNING"), running_for_s=900).state == RUNNING  # no limit, no HUNG
    assert not classify(seen("RUNNING"), heartbeat_age_s=700, hung_after_s=600).terminal


def test_heartbeat_age_and_trace_loading(tmp_path):
    assert heartbeat_age(tmp_path, "r1") is None
    write_heartbeat(tmp_path, "r1", 1, 3)
    path = tmp_path / "r1.heartbeat.json"
    old = time.time() - 500
    os.utime(path, (old, old))
    assert 499 < heartbeat_age(tmp_path, "r1") < 510
    assert load_trace(tmp_path, "r1") == (None, "no trace written")
    (tmp_path / "r2.trace.json").write_text("{not json")
    trace, problem = load_trace(tmp_path, "r2")
    assert trace is None and problem.startswith("invalid trace")


def test_first_error_line_prefers_the_exception():
    assert first_error_line(TRACEBACK) == "flm bench: injected crash on rank 1 at step 1"
    assert first_error_line("x\nTraceback (most recent call last):\n  f()\nKeyError: 'a'\n") == (
        "KeyError: 'a'")
    assert first_error_line("ok\nsrun: error: task 0 failed\n") == "srun: error: task 0 failed"
    assert first_error_line("all good\n") is None


# Error lines of real ranks: (text, collateral?, where it was seen).
GLOO_READ = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] "
             "Read error [127.0.0.1]:33712: Connection reset by peer. This is typically caused "
             "by a remote worker hanging or bugs in the application. Check the logs of the "
             "remote worker before reporting an error. GLHF! \U0001f3d6\ufe0f")
RANK_ERRORS = [
    # torch 2.13 gloo here: rank 0 of flm bench --dp 2 when rank 1 crashes (srun and local)
    (GLOO_READ, True, "flm bench --fault crash, local SLURM"),
    # the same with FLM_COLLECTIVE_TIMEOUT=5 when rank 1 hangs
    ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
     "unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to complete", True,
     "flm bench --fault hang"),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
     "peer [127.0.0.1]:10895", True,
     "github.com/RVC-Project/Retrieval-based-Voice-Conversion-WebUI/issues/1882"),
    ("[rank3]: torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/pytorch/torch/"
     "csrc/distributed/c10d/ProcessGroupNCCL.cpp:3763, remote process exited or there was a "
     "network error, NCCL version 2.28.8", True, "github.com/NVIDIA/nccl/issues/1928"),
    ("ncclRemoteError: A call failed possibly due to a network error or a remote process "
     "exiting prematurely.", True, "github.com/NVIDIA/nccl/issues/2076"),
    ("[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught "
     "collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, "
     "NumelOut=466119168, Timeout(ms)=600000) ran for 600060 milliseconds before timing out.",
     True, "github.com/hiyouga/LlamaFactory/issues/7396"),
    ("Net : Connection closed by remote peer user<50260>", True,
     "github.com/NVIDIA/nccl/issues/1514"),
    # root causes
    ("flm bench: injected crash on rank 1 at step 1", False, "flm bench --fault crash"),
    ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
     "ProcessGroupNCCL.cpp:1331, unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
     False, "github.com/pytorch/pytorch/issues/111187"),
    ("RuntimeError: CUDA error: peer access is not supported between these two devices", False,
     "CUDA's cudaErrorPeerAccessUnsupported text"),
    ("ValueError: heads (4) is not divisible by tp (3)", False, "a refused layout"),
    ("srun: error: vm: task 1: Exited with exit code 1", False, "srun, local SLURM"),
]


@pytest.mark.parametrize("text, collateral, source", RANK_ERRORS,
                         ids=[f"{i}-{'echo' if c else 'cause'}"
                              for i, (_, c, _) in enumerate(RANK_ERRORS)])
def test_a_lost_peer_is_told_from_a_root_cause(text, collateral, source):
    assert is_collateral(text) is collateral, source


# The step log of a packed layout whose rank 1 crashed, in the order srun once forwarded it:
# rank 0's gloo error above rank 1's own line. Rank 0 wrote the trace.
PEER_FIRST = f"""flm: task 0 job crash run crash-j7 on vm
Traceback (most recent call last):
  File "frontier_llm/bench/run.py", line 300, in run_rank
{GLOO_READ}
flm bench: injected crash on rank 1 at step 1
srun: error: vm: task 1: Exited with exit code 1
srun: error: vm: task 0: Exited with exit code 1
"""
TRACE_ECHO = "rank 1 left no report (crashed or hung?); rank 0: " + GLOO_READ


@pytest.mark.parametrize("log, trace_error, reason", [
    (PEER_FIRST, TRACE_ECHO, "flm bench: injected crash on rank 1 at step 1"),
    (PEER_FIRST, None, "flm bench: injected crash on rank 1 at step 1"),
    # every error an echo: the bench's choice, which names the silent rank
    (f"Traceback (most recent call last):\n{GLOO_READ}\n", TRACE_ECHO, TRACE_ECHO),
    (f"{GLOO_READ}\n", None, GLOO_READ[:500]),
    # a root cause in the trace beats an echo in the log
    (f"{GLOO_READ}\n", "rank 1: ValueError: bad batch", "rank 1: ValueError: bad batch"),
    # the log's own root cause still comes first, as before
    ("KeyError: 'a'\n", "rank 0: ValueError: b", "KeyError: 'a'"),
    ("", None, None),
])
def test_failure_reason_prefers_the_root_cause(log, trace_error, reason):
    assert failure_reason(log, trace_error) == reason


def test_failed_packed_step_names_the_crash_not_the_peer():
    trace = {"status": "failed", "error": TRACE_ECHO}
    for word, code in (("FAILED", "1:0"), ("EXITED", "1")):
        v = classify(seen(word, code), trace=trace, log_text=PEER_FIRST)
        assert (v.state, v.reason) == (FAILED, "flm bench: injected crash on rank 1 at step 1")


def test_exit_status_and_helpers():
    assert exit_status("42:0") == (42, 0)
    assert exit_status("0:15") == (0, 15)
    assert exit_status(-9) == (None, 9)
    assert exit_status(None) == (None, None)
    assert array_spec([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert array_spec([3]) == "3"
    assert time_limit_s("00:05:00") == 300
    assert time_limit_s("1-02:00:00") == 93600
    assert time_limit_s("7") == 420
    assert time_limit_s("2:30") == 150


def test_cancel_beats_the_traces_sigterm_timeout():
    """flm bench writes status 'timeout' on any SIGTERM; scancel sends one too."""
    trace = {"status": "timeout", "error": "terminated by SIGTERM"}
    assert classify(seen("CANCELLED", "0:15"), trace=trace).state == "CANCELLED"
    assert classify(seen("TIMEOUT", "0:15"), trace=trace).state == "TIMEOUT"
    assert classify(seen("FAILED", "1:0"), trace=trace).state == "TIMEOUT"


def test_job_state_predicates():
    J = JobState
    assert {s for s in J if s.terminal} == {J.COMPLETED, J.OOM, J.TIMEOUT, J.NODE_FAIL,
                                           J.PREEMPTED, J.CANCELLED, J.FAILED, J.LOST}
    assert {s for s in J if s.active} == {J.PENDING, J.RUNNING, J.HUNG, J.UNKNOWN}
    # Retry never re-runs a completed job; a HUNG one is retried (after a cancel).
    assert {s for s in J if s.retryable} == {J.OOM, J.TIMEOUT, J.NODE_FAIL, J.PREEMPTED,
                                            J.CANCELLED, J.FAILED, J.HUNG, J.LOST}
    assert not any(s.active and s.terminal for s in J)
    assert J("COMPLETED") is J.COMPLETED and f"{J.HUNG}" == "HUNG"  # stored as its word


def test_every_verdict_a_scheduler_state_can_give_is_a_job_state():
    for state in SchedulerState:
        verdict = classify(Observation(state, "1:0"))
        assert isinstance(verdict.state, JobState)
        assert verdict.terminal == state.ended, state


def test_a_job_the_scheduler_forgot_is_judged_by_its_files():
    """No scheduler record (a controller restarted without its state): the trace decides, and
    without a final trace the job is LOST (retryable), never UNKNOWN for ever."""
    gone = JobStatus("1", "UNKNOWN", found=False).observation()
    assert gone.gone and gone.state == SchedulerState.UNKNOWN
    assert classify(gone, trace={"status": "completed"}).state == "COMPLETED"
    assert classify(gone, trace={"status": "oom", "error": "x"}).state == "OOM"
    failed = classify(gone, trace={"status": "failed", "error": "RuntimeError: boom"})
    assert (failed.state, failed.reason) == ("FAILED", "RuntimeError: boom")
    stopped = classify(gone, trace={"status": "timeout", "error": "terminated by SIGTERM"})
    assert stopped.state == "LOST" and "stopped by a signal" in stopped.reason
    lost = classify(gone, trace_problem="no trace written", heartbeat_age_s=42.0)
    assert lost.state == "LOST" and "last heartbeat 42 s ago" in lost.reason
    assert JobState.LOST.retryable and JobState.LOST.terminal
    # A word SLURM may add one day is not a forgotten job.
    assert classify(seen("NO_SUCH_WORD")).state == "UNKNOWN"
