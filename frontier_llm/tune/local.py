"""The local executor for studies: each trial's job is a process of its own, started and left
running, so that ``flm tune step`` returns at once as it does with SLURM.

The sweep's local executor (jobs.executors.LocalExecutor) runs jobs in the foreground and waits;
a study step must not hold its lock for the length of a job. Observation is by process id (a
job started by this process is polled for its exit code; one started by an earlier process is
alive or not, and its trace says how it ended). Time limits are not enforced here: use the
slurm executor where they matter.
"""

from __future__ import annotations

import subprocess

from frontier_llm.jobs.executors import (
    LocalExecutor,
    _alive,
    _HeldInterrupt,
    _local_pid,
    _same_process,
    local_id,
)
from frontier_llm.jobs.lifecycle import JobState, Observation, SchedulerState

# Processes this interpreter started, so their exit codes can be read (and zombies reaped).
_CHILDREN: dict[int, subprocess.Popen] = {}


class DetachedLocalExecutor(LocalExecutor):
    name = "local"

    def submit(self, manifest, keys, recorder, *, token, max_in_flight=None, hold=False):
        for key in keys:
            job = manifest.job(key)
            # Ctrl-C waits until the started process is recorded: unrecorded, it would run on
            # (its own session) and a resume would start the job again.
            with _HeldInterrupt():
                proc, fh, run_id = self._start(manifest, job, token)
                fh.close()  # the process holds its own copy
                _CHILDREN[proc.pid] = proc
                recorder.submitted({key: (local_id(proc.pid, token), job["index"], run_id)},
                                   JobState.RUNNING)

    def observe(self, manifest, rows):
        out = {}
        for r in rows:
            pid = _local_pid(r.get("scheduler_job_id"))
            if pid is None:
                continue
            proc = _CHILDREN.get(pid)
            if proc is not None:
                code = proc.poll()
                if code is None:
                    out[r["job_key"]] = Observation(SchedulerState.RUNNING)
                elif code < 0:
                    out[r["job_key"]] = Observation(SchedulerState.CANCELLED, f"0:{-code}")
                else:
                    out[r["job_key"]] = Observation(SchedulerState.EXITED, f"{code}:0")
            else:
                # Started by an earlier process: alive only if the pid is still the process the
                # trial started as (not a later process that reused it).
                same = _same_process(r["scheduler_job_id"])
                out[r["job_key"]] = Observation(
                    SchedulerState.RUNNING if same is not False and _alive(pid)
                    else SchedulerState.EXITED)
        return out
