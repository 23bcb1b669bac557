"""Executors: where a sweep's jobs run. One interface, two implementations.

``slurm`` submits each group's script as a job array (sbatch) and observes all jobs with one
batched query per poll. ``local`` runs the same ``flm bench`` command lines as processes on this
machine (flm bench starts its own ranks), with the same trace and log layout, so a sweep can be
tried on a laptop and the tests need no cluster for it.

Both report to a :class:`Recorder` as they go, so what is recorded never lags what happened:
a crash between two sbatch calls loses nothing already submitted. Both describe a job with the
same :class:`~frontier_llm.jobs.lifecycle.Observation`; SLURM's words stay in ``slurm.py``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from frontier_llm.child import flm
from frontier_llm.errors import UserError
from frontier_llm.jobs.contract import (
    PACK_KEYS_ENV,
    PASS_ENV_VAR,
    STEP_LOG,
    SUBMIT_TOKEN_ENV,
    attempt_log_name,
    restart_of,
)
from frontier_llm.jobs.contract import run_id as make_run_id
from frontier_llm.jobs.lifecycle import JobState, Observation, SchedulerState
from frontier_llm.jobs.packing import pack_keys, step_observation
from frontier_llm.jobs.slurm import SlurmClient, base_id
from frontier_llm.jobs.sweepdir import Manifest

# key -> (scheduler job id, array index, run id)
Submission = tuple[str, int | None, str]


class Recorder(Protocol):
    def submitted(self, jobs: Mapping[str, Submission], state: JobState) -> None: ...
    def observed(self, jobs: Mapping[str, Observation]) -> None: ...


class Executor(ABC):
    name: str

    @abstractmethod
    def submit(self, manifest: Manifest, keys: Sequence[str], recorder: Recorder, *,
               token: str, max_in_flight: int | None = None, hold: bool = False) -> None:
        """Start ``keys``; tell ``recorder`` about each submission as soon as it is made."""

    @abstractmethod
    def observe(self, manifest: Manifest, rows: Sequence[Mapping[str, Any]]
                ) -> dict[str, Observation]:
        """The current state of the jobs in ``rows`` (job rows with scheduler ids)."""

    @abstractmethod
    def cancel(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Stop the jobs in ``rows``."""

    @abstractmethod
    def log_path(self, manifest: Manifest, row: Mapping[str, Any]) -> Path | None:
        """The output file of the job's current attempt."""

    def job_environ(self) -> Mapping[str, str]:
        """The environment the jobs start from (environment.pass_env values come from it)."""
        return os.environ

    def find_submitted(self, manifest: Manifest, token: str) -> dict[str, Submission]:
        """Submissions made under ``token`` that were never recorded (after a crash)."""
        return {}

    def ended_attempts(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Observation]]:
        """Every ended run the scheduler recorded of each job in ``rows``, oldest first (a job
        it requeued has several under one id); {} where the executor never requeues."""
        return {}


def array_spec(indices: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8" (sbatch --array syntax)."""
    out = []
    ids = sorted(set(indices))
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


class SlurmExecutor(Executor):
    name = "slurm"

    def __init__(self, client: SlurmClient | None = None) -> None:
        self.client = client or SlurmClient()

    def job_environ(self) -> Mapping[str, str]:
        # sbatch hands its own environment to the job (--export=ALL unless told otherwise).
        return os.environ if self.client.env is None else self.client.env

    def submit(self, manifest, keys, recorder, *, token, max_in_flight=None, hold=False):
        by_group: dict[str, list[dict]] = {}
        for key in keys:
            job = manifest.job(key)
            by_group.setdefault(job["group"], []).append(job)
        previous = None
        for group in manifest.groups:  # the manifest's order: predictable submission order
            jobs = by_group.get(group["name"])
            if not jobs:
                continue
            spec = array_spec([j["index"] for j in jobs])
            if max_in_flight:
                spec += f"%{max_in_flight}"
            # With a limit, arrays run one after the other (each throttled), so at most
            # max_in_flight jobs of the sweep hold the machine at any time.
            dependency = f"afterany:{previous}" if (max_in_flight and previous) else None
            extra = [f"--comment=flm:{manifest.sweep}:{token}:{group['name']}"]
            # The job writes the token beside its trace when it starts (contract.TOKEN_FILE).
            export = f"--export=ALL,{SUBMIT_TOKEN_ENV}={token}"
            only = pack_keys(manifest, group["name"], jobs)
            if only:
                export += f",{PACK_KEYS_ENV}={only}"
            extra.append(export)
            job_id = self.client.submit(
                manifest.path(group["script"]), array=spec, hold=hold, dependency=dependency,
                chdir=manifest.directory, extra_args=extra,
            )
            previous = job_id
            recorder.submitted(
                {j["key"]: (f"{job_id}_{j['index']}", j["index"], make_run_id(j["key"], job_id))
                 for j in jobs}, JobState.PENDING)

    def observe(self, manifest, rows):
        # The layouts of a packed allocation share its job id: one id, several rows.
        ids: dict[str, list[Mapping[str, Any]]] = {}
        for r in rows:
            if r.get("scheduler_job_id"):
                ids.setdefault(r["scheduler_job_id"], []).append(r)
        statuses = self.client.query(list(ids))
        out = {}
        for job_id, status in statuses.items():
            for r in ids.get(job_id, ()):
                obs = status.observation()
                if "step" in manifest.job(r["job_key"]):
                    # A requeued allocation's steps write the files of its new attempt.
                    run = (make_run_id(r["job_key"], base_id(job_id), obs.restarts)
                           if obs.restarts else r.get("run_id"))
                    obs = step_observation(obs, manifest.trace_dir, run)
                    obs = replace(obs, restarts=status.restarts)
                out[r["job_key"]] = obs
        return out

    def ended_attempts(self, rows):
        keys: dict[str, list[str]] = {}
        for r in rows:
            if r.get("scheduler_job_id"):
                keys.setdefault(r["scheduler_job_id"], []).append(r["job_key"])
        runs = self.client.ended_attempts(list(keys))
        return {k: [s.observation() for s in runs.get(sid, [])]
                for sid, ks in keys.items() for k in ks}

    def cancel(self, rows):
        self.client.cancel([r["scheduler_job_id"] for r in rows if r.get("scheduler_job_id")])

    def log_path(self, manifest, row):
        sid = row.get("scheduler_job_id")
        if not sid:
            return None
        if "step" in manifest.job(row["job_key"]) and row.get("run_id"):
            return manifest.trace_dir / f"{row['run_id']}{STEP_LOG}"  # the step's own output
        group = manifest.job(row["job_key"])["group"]
        restart = restart_of(row.get("run_id") or "", row["job_key"], base_id(sid)) or 0
        return manifest.path(
            f"logs/{group}/{attempt_log_name(row['array_index'], base_id(sid), restart)}")

    def find_submitted(self, manifest, token):
        prefix = f"flm:{manifest.sweep}:{token}:"
        found: dict[str, Submission] = {}
        for job_id, comment in self.client.find_by_comment(prefix).items():
            group = comment[len(prefix):]
            base, _, index = job_id.partition("_")
            if not index.isdigit():
                continue
            for j in manifest.jobs:
                if j["group"] == group and j["index"] == int(index):
                    found[j["key"]] = (job_id, j["index"], make_run_id(j["key"], base))
        return found


_TIME = re.compile(r"\A(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?\Z")


def time_limit_s(text: str) -> float:
    """SLURM's time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    m = _TIME.match(text.strip())
    if not m:
        raise UserError(f"time limit {text!r} is not a SLURM time")
    days, a, b, c = (int(x) if x else None for x in m.groups())
    if days is not None:
        return days * 86400 + (a or 0) * 3600 + (b or 0) * 60 + (c or 0)
    if c is not None:
        return a * 3600 + b * 60 + c
    if b is not None:
        return a * 60 + b
    return a * 60


class LocalExecutor(Executor):
    """Runs jobs as processes here, ``max_in_flight`` at a time (default 1), in the foreground.

    Each process gets its own session so a time limit or a cancel stops all its ranks.
    """

    name = "local"

    def __init__(self, poll_s: float = 0.2, extra_env: Mapping[str, str] | None = None) -> None:
        self.poll_s = poll_s
        self.extra_env = dict(extra_env or {})

    def _argv(self, manifest: Manifest, job: Mapping[str, Any], run_id: str) -> list[str]:
        return [*local_command(job["command"]), *job["argv"], "--run-id", run_id,
                "--trace-dir", str(manifest.trace_dir)]

    def _env(self, manifest: Manifest, job: Mapping[str, Any], run_id: str) -> dict[str, str]:
        """A local job's environment: this shell's, then what a job script exports that is
        not the site's (FLM_SWEEP, the sweep's ``environment.env``, the names of its
        ``pass_env``, whose values this shell holds), then the job's names.
        ``environment.modules`` and ``setup`` are shell for the cluster and not run here."""
        passed = {PASS_ENV_VAR: " ".join(manifest.pass_env)} if manifest.pass_env else {}
        return {**os.environ, "OMP_NUM_THREADS": "1", "FLM_SWEEP": manifest.sweep,
                **manifest.env, **passed, **self.extra_env, "FLM_JOB_KEY": job["key"],
                "FLM_RUN_ID": run_id}

    def _start(self, manifest: Manifest, job: Mapping[str, Any],
               token: str) -> tuple[subprocess.Popen, Any, str]:
        """Start one job in its own session, its output to its attempt's log: (process, the
        open log, run id). Call it where Ctrl-C is held (_HeldInterrupt) until it is recorded."""
        run_id = make_run_id(job["key"], token)
        log = manifest.path(_local_log(job, token))
        log.parent.mkdir(parents=True, exist_ok=True)
        fh = open(log, "wb")  # noqa: SIM115 (the caller closes it)
        proc = subprocess.Popen(
            self._argv(manifest, job, run_id), stdout=fh, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, cwd=manifest.directory, start_new_session=True,
            env=self._env(manifest, job, run_id))
        return proc, fh, run_id

    def submit(self, manifest, keys, recorder, *, token, max_in_flight=None, hold=False):
        if hold:
            raise UserError("--hold needs the slurm executor")
        queue = [manifest.job(k) for k in keys]
        limit = max(1, max_in_flight or 1)
        running: dict[str, tuple[subprocess.Popen, float, float, Any]] = {}
        # Ctrl-C is held to the points where ``running`` and the records match what runs: one
        # that raised between a process's start and its entry in ``running`` left its session
        # (out of reach of the terminal's Ctrl-C) running after flm exited, and a resume, which
        # finds no local submission again, ran the job a second time.
        with _HeldInterrupt() as interrupt:
            try:
                while queue or running:
                    while queue and len(running) < limit:
                        interrupt.deliver()
                        job = queue.pop(0)
                        proc, fh, run_id = self._start(manifest, job, token)
                        running[job["key"]] = (proc, time.monotonic(),
                                               time_limit_s(job["time"]), fh)
                        recorder.submitted(
                            {job["key"]: (local_id(proc.pid, token), job["index"], run_id)},
                            JobState.RUNNING)
                    done = {}
                    for key, (proc, started, limit_s, fh) in list(running.items()):
                        code = proc.poll()
                        if code is None and time.monotonic() - started > limit_s:
                            _kill_session(proc)
                            proc.wait()
                            done[key] = Observation(SchedulerState.TIMEOUT,
                                                    f"{proc.returncode}:0")
                        elif code is not None and code < 0:
                            # Killed by a signal that was not our time limit: flm sweep cancel.
                            done[key] = Observation(SchedulerState.CANCELLED, f"0:{-code}",
                                                    said=f"stopped by signal {-code}")
                        elif code is not None:
                            done[key] = Observation(SchedulerState.EXITED, f"{code}:0")
                        if key in done:
                            fh.close()
                            del running[key]
                    if done:
                        recorder.observed(done)
                    elif running:
                        time.sleep(self.poll_s)
                    interrupt.deliver()
            finally:
                # Interrupted (Ctrl-C): stop what runs and say so.
                if running:
                    for proc, _, _, fh in running.values():
                        _kill_session(proc)
                        proc.wait()
                        fh.close()
                    recorder.observed({k: Observation(SchedulerState.CANCELLED,
                                                      said="interrupted flm sweep submit")
                                       for k in running})

    def observe(self, manifest, rows):
        out = {}
        for r in rows:
            sid = r.get("scheduler_job_id")
            pid = _local_pid(sid)
            if pid is None:
                continue
            same = _same_process(sid)
            if same is None:
                host = _local_host(sid)
                out[r["job_key"]] = Observation(
                    SchedulerState.UNKNOWN,
                    said=(f"started on host {host}, not this one: ask there" if host else
                          "recorded by an older flm (no host or start time): cannot tell "
                          f"whether pid {pid} is still this job, so it is not signalled"))
                continue
            out[r["job_key"]] = Observation(
                SchedulerState.RUNNING if same and _alive(pid) else SchedulerState.EXITED)
        return out

    def cancel(self, rows):
        for r in rows:
            sid = r.get("scheduler_job_id")
            pid = _local_pid(sid)
            # Only the process the job started as: after a reboot, or once the job ended, its
            # pid may be any process's (a group of someone else's work) by now.
            if pid is not None and _same_process(sid) and _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGTERM)

    def log_path(self, manifest, row):
        sid = row.get("scheduler_job_id") or ""
        if not sid.startswith("local:"):
            return None
        token = sid.split(":")[2]
        return manifest.path(_local_log(manifest.job(row["job_key"]), token))


def _local_log(job: Mapping[str, Any], token: str) -> str:
    # Layouts packed into one array task share its index; the local executor runs each alone.
    index = f"{job['index']}.{job['step']}" if "step" in job else str(job["index"])
    return f"logs/{job['group']}/{index}-{token}.out"


def _local_pid(sid: str | None) -> int | None:
    if not sid or not sid.startswith("local:"):
        return None
    return int(sid.split(":")[1])


def local_id(pid: int, token: str) -> str:
    """A local job's scheduler id: ``local:PID:TOKEN:HOST:START``. The host and the process's
    start time (/proc/PID/stat, clock ticks since boot) say which process the pid named: a pid
    is reused once its process ends, and on another login node it names another process."""
    return f"local:{pid}:{token}:{socket.gethostname()}:{start_token(pid) or ''}"


def start_token(pid: int) -> str | None:
    """When process ``pid`` started (field 22 of /proc/PID/stat); None where unreadable."""
    fields = _stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def _local_host(sid: str) -> str:
    parts = sid.split(":")
    return parts[3] if len(parts) > 4 else ""


def _same_process(sid: str) -> bool | None:
    """Whether the process behind a local id is still the one the job started as: True, False
    (ended; its pid is free or another process's), or None (started on another host: this one
    cannot tell). An id of an older flm (``local:PID:TOKEN``: no host, no start time) cannot
    tell either: its pid may be anyone's process by now, so it is never signalled."""
    parts = sid.split(":")
    if len(parts) < 5:
        return None
    host, started = parts[3], parts[4]
    if host != socket.gethostname():
        return None
    if not started:
        return True  # no /proc where it started: the pid is all there is
    return start_token(int(parts[1])) == started


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie of ours is not alive.
    fields = _stat(pid)
    return fields is None or fields[0] != "Z"


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's closing parenthesis (state, ppid,
    pgrp, session, ...: the command may hold spaces and parentheses), or None where it cannot
    be read (ended, or no /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


class _HeldInterrupt:
    """Holds SIGINT, SIGHUP and SIGTERM inside ``with``: the handler only notes the signal, and
    ``deliver()`` (called where interrupting is safe) or the end of the block hands it on:
    SIGINT to the handler that was there before (Python's own raises KeyboardInterrupt), SIGHUP
    (the ssh session dropped) and SIGTERM (a kill, a shutdown) as KeyboardInterrupt too, so
    each ends a local submit as Ctrl-C does: its jobs stopped and recorded CANCELLED, never
    left recorded as running by a pid that another process may hold later. Only in the main
    thread (the only one Python delivers signals to); an ignored signal stays ignored (SIGINT
    in a background job, SIGHUP under nohup), and so does a SIGINT without a Python handler.

    Not ``pthread_sigmask``: a child inherits the blocked mask across exec, so the job's ranks
    would start deaf to Ctrl-C.
    """

    SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}
        self.pending: int | None = None

    def __enter__(self) -> _HeldInterrupt:
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in self.SIGNALS:
            current = signal.getsignal(sig)
            if current is signal.SIG_IGN or (sig == signal.SIGINT and not callable(current)):
                continue
            self.previous[sig] = signal.signal(sig, self._note)
        return self

    def _note(self, signum: int, frame: Any) -> None:
        # The first one wins: a SIGTERM after a Ctrl-C still ends it as one interrupt.
        if self.pending is None:
            self.pending = signum

    def deliver(self) -> None:
        if self.pending is None:
            return
        sig, self.pending = self.pending, None
        previous = self.previous.get(sig)
        if callable(previous):
            previous(sig, None)  # Python's SIGINT handler raises KeyboardInterrupt
            return
        raise KeyboardInterrupt(signal.Signals(sig).name)  # SIG_DFL would end flm unrecorded

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if not self.previous:
            return
        for sig, previous in self.previous.items():
            signal.signal(sig, previous)
        if kind is None:  # one that came during the last records still interrupts
            self.deliver()


def local_command(command: Sequence[str]) -> list[str]:
    """A job's command as this machine runs it: a leading ``flm`` becomes this interpreter's
    ``python -m frontier_llm.cli``, so that a job runs the installation that started it, also
    when flm was called by its absolute path from an environment that is not activated (its
    ``bin`` not on PATH). Batch scripts keep ``flm`` by name: on a cluster the script names
    its environment (FLM_VENV, the site's modules)."""
    command = list(command)
    if command[:1] == ["flm"]:
        return flm(command[1:])
    return command


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (zombies left out: a rank orphaned by its
    launcher stays a zombie wherever process 1 does not reap, and runs nothing). Read from
    /proc; where there is none, the group's leader stands for the group."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        fields = _stat(entry.name) if entry.name.isdigit() else None  # None: ended meanwhile
        if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def _wait_group(pgid: int, timeout_s: float) -> bool:
    """Wait until no live process is left in group ``pgid``; False if some still are."""
    deadline = time.monotonic() + timeout_s
    while group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _kill_session(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop a job's whole process group: SIGTERM (flm bench records it and its launcher stops
    its ranks), then SIGKILL for whatever is still alive after ``grace_s``. Waits for every
    member, not only the leader: a rank that outlived its launcher would hold its cores, its
    port and its trace after flm said the job had stopped."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    if not _wait_group(proc.pid, grace_s):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        _wait_group(proc.pid, 5.0)
    proc.wait()


def make_executor(name: str, client: SlurmClient | None = None) -> Executor:
    if name == "slurm":
        return SlurmExecutor(client)
    if name == "local":
        return LocalExecutor()
    raise UserError(f"executor must be slurm or local (got {name!r})")
