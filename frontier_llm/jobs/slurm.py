"""A small SLURM client: sbatch, squeue, sacct, scontrol and scancel through argument lists.

Never a shell: every value goes to the command as its own argv element, so nothing in a sweep
can be read as shell syntax. Polling is batched: one ``squeue`` call for every tracked job, plus
at most one ``sacct`` call for the jobs that have just ended (their exit codes), so the number
of commands per poll does not grow with the number of jobs. Without accounting (no slurmdbd, as
on the test cluster) ``sacct --completion`` reads the job-completion log instead.
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from frontier_llm.errors import UserError
from frontier_llm.jobs.lifecycle import Observation, SchedulerState

_S = SchedulerState
# SLURM's job states (squeue and sacct, "JOB STATE CODES") in frontier_llm's words. This is the
# only place that knows them; a word not here is UNKNOWN.
SLURM_STATES: Mapping[str, SchedulerState] = {
    **dict.fromkeys(("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                     "SUSPENDED", "RESV_DEL_HOLD", "STOPPED"), _S.PENDING),
    **dict.fromkeys(("RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING"), _S.RUNNING),
    "COMPLETED": _S.COMPLETED,
    **dict.fromkeys(("FAILED", "SPECIAL_EXIT"), _S.FAILED),
    "OUT_OF_MEMORY": _S.OUT_OF_MEMORY,
    **dict.fromkeys(("TIMEOUT", "DEADLINE"), _S.TIMEOUT),
    **dict.fromkeys(("NODE_FAIL", "BOOT_FAIL"), _S.NODE_FAIL),
    **dict.fromkeys(("CANCELLED", "REVOKED"), _S.CANCELLED),
    "PREEMPTED": _S.PREEMPTED,
}


def slurm_word(state: str | None) -> str:
    """SLURM's state word: "CANCELLED by 0" (how sacct words a cancellation) -> "CANCELLED"."""
    return state.split()[0].upper() if state and state.strip() else "UNKNOWN"


def scheduler_state(state: str | None) -> SchedulerState:
    return SLURM_STATES.get(slurm_word(state), SchedulerState.UNKNOWN)

# squeue --Format fields ("name:|" = no padding, "|" after): RestartCnt has no %-letter.
_SQUEUE_FIELDS = ("JobArrayID", "JobID", "State", "Reason", "NodeList", "StartTime", "EndTime",
                  "RestartCnt")
_SQUEUE_FORMAT = ",".join(f"{f}:|" for f in _SQUEUE_FIELDS)
_SACCT_FIELDS = "JobID,JobIDRaw,State,ExitCode,NodeList,Start,End"
_EMPTY = {"", "(null)", "N/A", "None", "NONE", "Unknown", "unknown"}

Runner = Callable[..., subprocess.CompletedProcess]


class SlurmError(UserError):
    """A SLURM command failed; the message is SLURM's own."""


class ControllerUnreachable(SlurmError):
    """slurmctld did not answer (down, restarting, overloaded): the jobs are not known to have
    changed, so a tracker keeps what it recorded and asks again later (runner.refresh)."""


# How SLURM's clients (22.05 to 24.x) say that the controller did not answer, as opposed to a
# refusal (bad id, bad option) that asking again would not change.
_UNREACHABLE = ("unable to contact slurm controller", "socket timed out", "connection refused",
                "zero bytes were transmitted", "communication connection failure",
                "slurmctld not responding", "slurm_receive_msg", "connection timed out",
                "controller in standby mode", "unable to connect")


def is_unreachable(stderr: str) -> bool:
    """Whether a SLURM client's error output says the controller could not be reached."""
    text = stderr.lower()
    return any(s in text for s in _UNREACHABLE)


def _failure(argv0: str, proc: subprocess.CompletedProcess, what: str | None = None
             ) -> SlurmError:
    message = _first_error(proc.stderr) or what or f"{argv0} exited {proc.returncode}"
    return (ControllerUnreachable if is_unreachable(proc.stderr) else SlurmError)(message)


@dataclass(frozen=True)
class JobStatus:
    """What SLURM says about one job (one array task counts as one job: ``"123_4"``)."""

    job_id: str
    state: str  # SLURM's word: PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT, ... or UNKNOWN
    reason: str | None = None
    exit_code: str | None = None  # "code:signal", as sacct and scontrol print it
    nodelist: str | None = None
    start: str | None = None
    end: str | None = None
    raw_id: str | None = None  # the scheduler's own id of this task (for sacct --completion)
    restarts: int | None = None  # RestartCnt: times SLURM requeued it (squeue only)
    found: bool = True  # False: neither squeue nor sacct knows the job

    @property
    def terminal(self) -> bool:
        return scheduler_state(self.state).ended

    def observation(self) -> Observation:
        """The executor-neutral record of this status (what the classifier reads)."""
        word = slurm_word(self.state)
        if not self.found:
            return Observation(SchedulerState.UNKNOWN, said="neither squeue nor sacct knows it",
                               gone=True)
        return Observation(scheduler_state(word), self.exit_code, self.nodelist, self.start,
                           self.end, said=f"SLURM state {word}", restarts=self.restarts)


def _clean(value: str) -> str | None:
    value = value.strip()
    return None if value in _EMPTY else value


def base_id(job_id: str) -> str:
    """``"123_4"`` -> ``"123"``; the id sbatch returned for the whole array."""
    return job_id.split("_", 1)[0]


class SlurmClient:
    """Talks to one SLURM controller (the one $SLURM_CONF names, if set).

    ``commands`` counts every SLURM command run, by name: the sweep benchmark reports it per poll.
    """

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        runner: Runner = subprocess.run,
        timeout_s: float = 120.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.env = dict(env) if env is not None else None
        self._runner = runner
        self._timeout = timeout_s
        self._sleep = sleep
        self.commands: Counter[str] = Counter()
        self._accounting: bool | None = None  # unknown until sacct first answers
        self._raw_ids: dict[str, str] = {}  # "123_4" -> raw id, learnt from squeue %A

    # --- plumbing ---------------------------------------------------------------------------
    def _run(self, argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess:
        self.commands[argv[0]] += 1
        try:
            proc = self._runner(
                list(argv), capture_output=True, text=True, timeout=self._timeout, env=self.env,
                check=False,
            )
        except FileNotFoundError:
            raise SlurmError(
                f"{argv[0]} not found: is SLURM installed here? (scripts/slurm-cluster.sh "
                "install sets up a local one)"
            ) from None
        except subprocess.TimeoutExpired:
            raise ControllerUnreachable(
                f"{argv[0]} did not answer within {self._timeout:.0f} s") from None
        if check and proc.returncode != 0:
            raise _failure(argv[0], proc)
        return proc

    # --- submission -------------------------------------------------------------------------
    def submit(
        self,
        script: str | Path,
        *,
        array: str | None = None,
        hold: bool = False,
        dependency: str | None = None,
        extra_args: Sequence[str] = (),
        chdir: str | Path | None = None,
    ) -> str:
        """sbatch the script; return the job id. A refusal raises SlurmError with SLURM's words."""
        argv = ["sbatch", "--parsable"]
        if array:
            argv.append(f"--array={array}")
        if hold:
            argv.append("--hold")
        if dependency:
            argv.append(f"--dependency={dependency}")
        if chdir is not None:
            argv.append(f"--chdir={chdir}")
        argv.extend(extra_args)
        argv.append(str(script))
        proc = self._run(argv)
        # --parsable prints "jobid" or "jobid;cluster".
        job_id = proc.stdout.strip().splitlines()[-1].split(";")[0] if proc.stdout.strip() else ""
        if not job_id.isdigit():
            raise SlurmError(f"sbatch gave no job id (stdout: {proc.stdout.strip()!r})")
        return job_id

    def cancel(self, job_ids: Iterable[str], *, signal: str | None = None) -> None:
        ids = sorted(set(job_ids))
        if not ids:
            return
        argv = ["scancel"] + ([f"--signal={signal}"] if signal else []) + ids
        proc = self._run(argv, check=False)
        # scancel cancels the ids it knows and complains of the others: a job the controller
        # has already forgotten (ended, or lost with its state) needs no cancelling.
        errors = [ln for ln in proc.stderr.splitlines() if ln.strip()
                  and "invalid job id" not in ln.lower()]
        if proc.returncode != 0 and errors:
            raise _failure("scancel", proc)

    def release(self, job_ids: Iterable[str]) -> None:
        ids = sorted(set(job_ids))
        if ids:
            self._run(["scontrol", "release", ",".join(ids)])

    # --- queries ----------------------------------------------------------------------------
    def query(self, job_ids: Iterable[str]) -> dict[str, JobStatus]:
        """Status of each job: one squeue call, plus one sacct call for jobs that ended.

        ``job_ids`` may hold plain ids and array-task ids (``"12_3"``); an array's id (``"12"``)
        stands for all its tasks. Jobs neither command knows come back as state UNKNOWN.
        """
        wanted = list(dict.fromkeys(job_ids))
        if not wanted:
            return {}
        bases = sorted({base_id(j) for j in wanted}, key=int)
        found = self._squeue(bases)
        ended = [j for j, s in found.items() if s.terminal]
        missing = [j for j in wanted if j not in found and not any(
            k.startswith(f"{j}_") for k in found)]
        if ended or missing:
            for job_id, status in self._sacct(ended + missing).items():
                prev = found.get(job_id)
                if prev is None:
                    found[job_id] = status
                elif status.terminal:
                    found[job_id] = replace(
                        prev, state=status.state.split()[0], exit_code=status.exit_code,
                        nodelist=prev.nodelist or status.nodelist, end=prev.end or status.end,
                    )
        out: dict[str, JobStatus] = {}
        for j in wanted:
            if j in found:
                out[j] = found[j]
            elif "_" not in j and any(k.startswith(f"{j}_") for k in found):
                out.update({k: v for k, v in found.items() if k.startswith(f"{j}_")})
            else:
                out[j] = JobStatus(job_id=j, state="UNKNOWN", found=False)
        return out

    def _squeue(self, bases: Sequence[str]) -> dict[str, JobStatus]:
        proc = self._run(
            ["squeue", "--noheader", "--array", "--states=all", f"--jobs={','.join(bases)}",
             f"--Format={_SQUEUE_FORMAT}"],
            check=False,
        )
        if proc.returncode != 0:
            # An id the controller has already forgotten makes some versions refuse the query;
            # the jobs it did know about are then looked up in sacct.
            if "Invalid job id" in proc.stderr:
                return {}
            raise _failure("squeue", proc, "squeue failed")
        found: dict[str, JobStatus] = {}
        for line in proc.stdout.splitlines():
            parts = line.split("|")
            if len(parts) < len(_SQUEUE_FIELDS):
                continue
            job_id, raw, state, reason, nodelist, start, end, restarts = (
                p.strip() for p in parts[:len(_SQUEUE_FIELDS)])
            self._raw_ids[job_id] = raw
            found[job_id] = JobStatus(
                job_id=job_id, state=state, reason=_clean(reason), nodelist=_clean(nodelist),
                start=_clean(start), end=_clean(end), raw_id=raw,
                restarts=int(restarts) if restarts.isdigit() else None,
            )
        return found

    def _sacct(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """The latest run of each job, with how often SLURM requeued it before (``restarts``:
        the runs recorded before the latest)."""
        return {j: replace(runs[-1], restarts=len(runs) - 1)
                for j, runs in self.ended_attempts(job_ids).items() if runs}

    def ended_attempts(self, job_ids: Sequence[str]) -> dict[str, list[JobStatus]]:
        """Every recorded run of each job, oldest first (one sacct call): a requeued job has
        one record per attempt (sacct --duplicates; the job-completion log keeps them all)."""
        if not job_ids:
            return {}
        fields = f"--format={_SACCT_FIELDS}"
        if self._accounting is not False:
            proc = self._run(["sacct", "--noheader", "--parsable2", "--allocations",
                              "--duplicates", f"--jobs={','.join(job_ids)}", fields], check=False)
            if proc.returncode == 0:
                self._accounting = True
                return self._parse_runs(proc.stdout, {j: [j] for j in job_ids}, by_raw=False)
            if "accounting storage is disabled" not in proc.stderr.lower():
                raise _failure("sacct", proc, "sacct failed")
            self._accounting = False
        # The job-completion log knows only raw ids: array tasks are found by the raw id that
        # squeue reported while they lived.
        raw_to_ids: dict[str, list[str]] = {}
        for j in job_ids:
            raw_to_ids.setdefault(self._raw_ids.get(j, base_id(j) if "_" not in j else j),
                                  []).append(j)
        raws = [r for r in raw_to_ids if r.isdigit()]
        if not raws:
            return {}
        proc = self._run(["sacct", "--completion", "--noheader", "--parsable2",
                          f"--jobs={','.join(raws)}", fields], check=False)
        if proc.returncode != 0:
            raise _failure("sacct", proc, "sacct --completion failed")
        return self._parse_runs(proc.stdout, raw_to_ids, by_raw=True)

    @staticmethod
    def _parse_runs(text: str, ids: Mapping[str, list[str]], *, by_raw: bool
                    ) -> dict[str, list[JobStatus]]:
        out: dict[str, list[JobStatus]] = {}
        for line in text.splitlines():
            parts = [p.strip() for p in line.split("|")]
            if len(parts) < 7 or "." in parts[0]:  # job steps: the allocation speaks for all
                continue
            job_id, raw, state, exit_code, nodelist, start, end = parts[:7]
            word = slurm_word(state)
            # A run that ended, or the record a requeue leaves (scontrol requeue).
            if not (scheduler_state(word).ended or word.startswith("REQUEUE")):
                continue
            for j in ids.get(raw if by_raw else job_id, ()):
                out.setdefault(j, []).append(JobStatus(
                    job_id=j, state=word, exit_code=_clean(exit_code),
                    nodelist=_clean(nodelist), start=_clean(start), end=_clean(end),
                    raw_id=raw))
        for runs in out.values():
            runs.sort(key=lambda s: (s.start or "", s.end or ""))
        return out

    def queued_count(self) -> int:
        """The user's jobs the controller holds now, each array task counted (one squeue
        call): what a site's per-user queue limit counts."""
        proc = self._run(["squeue", "--noheader", "--array", "--me", "--format=%i"])
        return sum(1 for line in proc.stdout.splitlines() if line.strip())

    def find_by_comment(self, prefix: str) -> dict[str, str]:
        """Live or recent jobs whose comment starts with ``prefix``: job id -> comment (one
        squeue call; finds a submission whose id was never recorded)."""
        proc = self._run(["squeue", "--noheader", "--array", "--states=all", "--me",
                          "--format=%i|%k"])
        out = {}
        for line in proc.stdout.splitlines():
            job_id, _, comment = line.partition("|")
            if comment.strip().startswith(prefix):
                out[job_id.strip()] = comment.strip()
        return out

    # --- waiting ----------------------------------------------------------------------------
    def wait(
        self,
        job_ids: Iterable[str],
        *,
        timeout_s: float,
        until: Callable[[Mapping[str, JobStatus]], bool] | None = None,
        min_interval_s: float = 0.5,
        max_interval_s: float = 10.0,
    ) -> dict[str, JobStatus]:
        """Poll with exponential back-off (x1.5 up to ``max_interval_s``) until every job ended
        (or ``until(statuses)`` is true); return the last statuses."""
        ids = list(job_ids)
        deadline = time.monotonic() + timeout_s
        interval = min_interval_s
        while True:
            statuses = self.query(ids)
            done = until(statuses) if until else all(s.terminal for s in statuses.values())
            if done or time.monotonic() >= deadline:
                return statuses
            self._sleep(min(interval, max(0.0, deadline - time.monotonic())))
            interval = min(max_interval_s, interval * 1.5)


def _first_error(stderr: str) -> str:
    """SLURM's own message, without the program prefix noise: the most telling stderr line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in lines:
        if "error" in ln.lower():
            return ln
    return lines[0] if lines else ""
