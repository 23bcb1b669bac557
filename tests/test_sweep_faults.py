"""The scheduler's own faults, on a real one-node SLURM of this module's own: an interrupted
submit whose job SLURM has already forgotten, a node daemon killed under a running job (SLURM
declares NODE_FAIL and requeues it), a controller restart during ``flm sweep status --wait``,
a controller restart that loses all its state, and a controller that stays away.

One cluster for all of them (its own folder, ports and munge), started with a short MinJobAge
(ended jobs leave squeue after 5 s), a short SlurmdTimeout (a silent node is DOWN within
seconds) and a short MessageTimeout (a client gives up on a silent controller in seconds), so
every fault shows in seconds instead of the minutes a production cluster takes. Nothing is
faked: the daemons are stopped and started by their pid files (scripts/slurm-cluster.sh).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from slurm_fixtures import (
    SlurmCluster,
    flm,
    slurm_conf,
    start_cluster,
    stop_cluster,
    sweep_status,
    tiny_sweep,
    wait_for,
)

from frontier_llm.jobs import runner
from frontier_llm.jobs.lifecycle import JobState
from frontier_llm.jobs.slurm import SlurmClient
from frontier_llm.jobs.sweepspec import load_sweep
from frontier_llm.store import open_store

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

def sweep_file(tmp_path: Path, name: str, layouts: list[str], steps: int = 3) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(tiny_sweep(name, layouts, steps))
    return path


@pytest.fixture(scope="module")
def cluster():
    """A cluster of this module's own: its faults (a killed node daemon, a controller that
    loses its state) must not reach the session's cluster the other tests share. SLURM_CONF
    points at it while this module runs. Its job ids start at 7001: a job's rendezvous port
    follows its id (docs/sweeps.md), and the session's cluster on the same host numbers its
    jobs from 1, so equal ids there and here would put two jobs on one port (seen: a stress run
    of this module beside copies of itself failed its jobs with EADDRINUSE on port 20002)."""
    env = {**os.environ, "FLM_SLURM_MIN_JOB_AGE": "5", "FLM_SLURM_SLURMD_TIMEOUT": "5",
           "FLM_SLURM_EXTRA_CONF": "MessageTimeout=3\nFirstJobId=7001"}
    cluster = start_cluster("flm-slurm-faults-", env)
    try:
        with slurm_conf(cluster):
            yield cluster
    finally:
        # Its stop also ends the step daemons the faults leave (a forgotten job's retry its
        # last message for ever) and their tasks.
        stop_cluster(cluster.directory)


def cluster_report(cluster: SlurmCluster, job: str | None = None) -> str:
    """What the cluster says now, for a failure message: the job (``scontrol show job``, or the
    queue), the node's state and reason, the completion records and the last 40 lines of the
    controller's and the node daemon's logs (the cluster's folder goes with the fixture)."""
    ask = ["scontrol", "show", "job", job] if job else ["squeue", "-a", "-l"]
    parts = [subprocess.run(cmd, env=cluster.env(), capture_output=True, text=True)
             for cmd in (ask, ["sinfo", "-R"])]
    log = cluster.directory / "log"
    text = "".join(f"{p.stdout}{p.stderr}\n" for p in parts)
    text += "jobcomp:\n" + (log / "jobcomp.txt").read_text(errors="replace")[-3000:]
    for name in ("slurmctld.log", "slurmd.log"):
        if (log / name).exists():
            text += f"\n{name} (last 40 lines):\n" + "\n".join(
                (log / name).read_text(errors="replace").splitlines()[-40:])
    return text


def job_pids(cluster: SlurmCluster, job: str) -> list[int]:
    """The processes of ``job``'s tasks on this node (scontrol listpids asks its step daemons,
    which live on without slurmd)."""
    out = subprocess.run(["scontrol", "listpids", job.split("_")[0]], capture_output=True,
                         text=True, env=cluster.env()).stdout
    return [int(line.split()[0]) for line in out.splitlines()[1:]
            if line.split() and line.split()[0].isdigit()]


def sinfo(cluster: SlurmCluster) -> str:
    return subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                          env=cluster.env()).stdout.strip()


class _Crash(Exception):
    pass


class _Reader:
    """A process's stdout and stderr, read as they come by a thread each: the test acts on what
    it said while it runs, and neither pipe fills up."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self._parts: dict[str, list[str]] = {"out": [], "err": []}
        self._threads = [threading.Thread(target=self._read, args=(stream, self._parts[k]),
                                          daemon=True)
                         for k, stream in (("out", proc.stdout), ("err", proc.stderr))]
        for t in self._threads:
            t.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    def _text(self, key: str) -> str:
        return "".join(self._parts[key])

    def out(self) -> str:
        """All of stdout (the process has ended: its readers finish first)."""
        for t in self._threads:
            t.join(timeout=30)
        return self._text("out")

    def err(self) -> str:
        return self._text("err")


def test_scheduler_faults(cluster, tmp_path, monkeypatch):
    db = f"sqlite:///{tmp_path}/flm.db"
    client = SlurmClient(cluster.env())

    # --- 1. An interrupted submit, resumed after SLURM has forgotten the finished job --------
    # The submit dies after sbatch returned, before the job id was recorded; the job runs,
    # ends, and leaves squeue (MinJobAge; part 2 runs meanwhile, the adoption follows it). The
    # next submit finds it by the token file the job wrote when it started and adopts it: one
    # SLURM job for the layout, not two.
    store = open_store(db)
    try:
        late = runner.prepare(load_sweep(sweep_file(tmp_path, "late", ["{dp: 1, micro_batch: 2, "
                                                                       "name: only}"])),
                              tmp_path / "late", store, client=client)

        def die(self, jobs, state):
            raise _Crash()

        monkeypatch.setattr(runner._Recorder, "submitted", die)
        with pytest.raises(_Crash):
            runner.submit(late)
        monkeypatch.undo()
        assert [r["state"] for r in late.state.rows()] == [JobState.SUBMITTING]
        traces = tmp_path / "late" / "traces"
        wait_for(lambda: list(traces.glob("*.trace.json")), 120, "the late job's trace")
        # Part 2 takes the node's daemon away: the late job must have left the node first (its
        # step daemons gone from the spool, SLURM's state COMPLETED, not COMPLETING). A step of
        # it still there when the node daemon registers again makes SLURM refuse the node to
        # the requeued job of part 2, which then stays PENDING (seen in full runs).
        spool = cluster.directory / "spool"

        def late_left_the_node() -> bool:
            jobs = list(client.find_by_comment("flm:late:"))
            if not jobs:
                return True  # forgotten (MinJobAge): long ended
            state = client.query(jobs[:1]).get(jobs[0])
            return (state is None or state.state == "COMPLETED") and not list(
                spool.glob(f"*_{jobs[0].split('_')[0]}.*"))

        wait_for(late_left_the_node, 60, "the late job to leave the node")
    except BaseException:
        store.close()
        raise

    # --- 2. A node failure under a running job, then a controller restart ------------------
    # slurmd stops: SLURM declares the node DOWN, the job NODE_FAIL, and requeues it under the
    # same id. The requeued attempt gets its own run id and log; `status --wait` keeps
    # tracking through a controller outage (as long as it takes to say the controller is gone)
    # and ends with the job COMPLETED, its first attempt kept as NODE_FAIL, and never HUNG on
    # the first attempt's stale heartbeat.
    # The first attempt must still run when the node fails, however fast this machine is (1500
    # steps once ended in 15 s on an idle one, before SLURM noticed the node: nothing to
    # requeue); the requeued attempt must end. A wrapper gives the first attempt steps for hours.
    # The second attempt runs 800 steps (8 s idle, start-up included): long enough to be
    # running, its heartbeat fresh, through the controller's outage on a loaded machine (with
    # the sweep's 30 it once ended, and the waiter saw COMPLETED, before the outage began).
    wrapper = tmp_path / "first-attempt-long.sh"
    wrapper.write_text('#!/bin/sh\nif [ "${SLURM_RESTART_COUNT:-0}" -eq 0 ]; then\n'
                       '    exec flm bench "$@" --steps 1000000\nfi\n'
                       'exec flm bench "$@" --steps 800\n')
    wrapper.chmod(0o755)
    spec = sweep_file(tmp_path, "requeue", ["{dp: 1, micro_batch: 2, name: long}"], steps=30)
    spec.write_text(spec.read_text() + f"command: [{wrapper}]\n")
    flm("sweep", "submit", spec, "--out", tmp_path / "requeue", "--db", db)
    amnesia = sweep_file(tmp_path, "amnesia", [  # part 3's
        "{dp: 1, micro_batch: 2, name: done}",
        "{dp: 1, micro_batch: 2, name: stuck1, bench_args: {fault: hang, fault_step: 1}}",
        "{dp: 1, micro_batch: 2, name: stuck2, bench_args: {fault: hang, fault_step: 1}}"])
    waiter = subprocess.Popen(
        [sys.executable, "-m", "frontier_llm.cli", "sweep", "status", "requeue", "--db", db,
         "--format", "json", "--wait", "--timeout", "400", "--max-interval", "1",
         "--hung-after", "25", "--collect"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env())
    said = _Reader(waiter)
    try:
        rtraces = tmp_path / "requeue" / "traces"
        try:
            wait_for(lambda: list(rtraces.glob("*.heartbeat.json")), 120, "the first heartbeat")
        except AssertionError as exc:
            logs = "".join(f"\n{p.name}:\n{p.read_text(errors='replace')[-2000:]}"
                           for p in sorted((tmp_path / "requeue" / "logs").rglob("*.out")))
            raise AssertionError(f"{exc}\n{cluster_report(cluster)}{logs}") from None
        cluster.ctl("stop-slurmd")
        job = wait_for(lambda: [j for j, s in client.query(
            [r["scheduler_job_id"] for r in sweep_status("requeue", db).values()]).items()
            if (s.restarts or 0) >= 1], 120, "SLURM to requeue the job")[0]
        # The node died with its processes: the first attempt's ranks go too (by their pids,
        # from the step daemons). Left alive, SLURM would kill them only when the job runs
        # again on this same node, and the new attempt with them.
        for pid in job_pids(cluster, job):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # Their step daemons report the end and exit; then the node daemon comes back.
        # (their sockets leave the spool folder): a step still there when slurmd registers
        # makes SLURM kill the job on the node, and refuse to launch it there again.
        spool = cluster.directory / "spool"
        wait_for(lambda: not list(spool.glob(f"*_{job.split('_')[0]}.*")), 90,
                 "the first attempt's step daemons to exit")
        cluster.ctl("start-slurmd")
        wait_for(lambda: sinfo(cluster) == "idle", 90, f"the node to be idle ({sinfo(cluster)})")
        # SLURM holds a requeued job for 2 minutes (its BeginTime); let it start now. Asked
        # again every few seconds while it is pending: an update that lands while SLURM is
        # still finishing the requeue can be overwritten by the requeue's own BeginTime (seen
        # once in a full run: the job stayed PENDING for the whole wait).
        last_release = [0.0]

        def pending() -> bool:
            state = client.query([job]).get(job)
            return state is not None and state.state == "PENDING"

        def second_heartbeat():
            beats = list(rtraces.glob("*-r1.heartbeat.json"))
            # Only while it waits: SLURM 22.05.8's controller segfaults (its RPC thread, a null
            # write; the kernel log's "srvcn ... segfault ... in slurmctld-wlm") on these
            # updates once the requeued job is being launched, before its heartbeat exists:
            # the controller's log ended at "sched: Allocate" and every later call found it
            # unreachable (two runs, here and in CI).
            if not beats and time.monotonic() - last_release[0] > 5 and pending():
                last_release[0] = time.monotonic()
                subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"],
                               check=False, env=cluster.env(), capture_output=True)
                # And released: a requeued batch job whose relaunch fails is held by SLURM
                # ("launch failed requeued held"), which no start time undoes (a no-op if not
                # held). One run in about seven kept the job PENDING on an idle node for the
                # whole wait; the failure below shows scontrol's view should it happen again.
                subprocess.run(["scontrol", "release", job], check=False, env=cluster.env(),
                               capture_output=True)
            return beats

        # The second attempt beats in a file of its own (srun needs the controller to start
        # its step, so the outage comes once the step runs).
        try:
            wait_for(second_heartbeat, 120, "the second attempt's heartbeat")
        except AssertionError as exc:  # say why SLURM kept it from starting, as it is now
            # scontrol answers a job it no longer holds on stderr only (a CI run printed
            # nothing); another found the controller unreachable here: its log says why.
            files = sorted(p.name for p in rtraces.glob("*"))
            raise AssertionError(
                f"{exc}\n{cluster_report(cluster, job)}\ntraces: {files}") from None
        pid = int((cluster.directory / "slurmctld.pid").read_text())
        os.kill(pid, 15)  # the controller goes away (by its pid file) ...
        # ... for as long as the waiter takes to find it gone (it says so), ...
        wait_for(lambda: "controller unreachable since" in said.err(), 120,
                 f"the waiter to see the controller gone: {said.err()}")
        cluster.ctl("restart-ctld")  # ... and comes back with its saved state
        # Part 3's sweep starts while the second attempt ends, once the waiter has the
        # controller back (nothing of part 3 is looked at before part 2's verdict).
        wait_for(lambda: "controller answers again" in said.err(), 120,
                 f"the waiter to reach the controller again: {said.err()}")
        flm("sweep", "submit", amnesia, "--out", tmp_path / "amnesia", "--db", db)
        waiter.wait(timeout=400)
    except BaseException:
        store.close()
        raise
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    out, err = said.out(), said.err()
    print("--- status --wait across a node failure and a controller restart:\n" + err)
    assert waiter.returncode == 0, err
    assert "controller unreachable since" in err and "still tracking" in err, err
    assert "controller answers again" in err, err
    assert "HUNG" not in out + err
    row = {r["job_key"]: r for r in json.loads(out)}["long"]
    assert row["state"] == "COMPLETED" and row["attempts"] == 2, row
    assert row["run_id"].endswith("-r1") and row["earlier"] == "1 NODE_FAIL", row
    logs = sorted(p.name for p in (tmp_path / "requeue" / "logs").rglob("*.out"))
    assert len(logs) == 2 and any(".r1." in n for n in logs), logs
    results = json.loads(flm("results", "--db", db, "--sweep", "requeue", "--format",
                             "json").stdout)
    print("--- flm results:", [(r["run_id"], r["status"], r["error"]) for r in results])
    assert sorted(r["status"] for r in results) == ["NODE_FAIL", "completed"], results

    # --- 1, continued: SLURM has forgotten the late job by now (MinJobAge 5 s, purged every
    # 10 s: part 2 took longer); the resumed submit adopts it.
    try:
        wait_for(lambda: not client.find_by_comment("flm:late:"), 60,
                 "SLURM to forget the finished job (MinJobAge)")
        sbatch_before = client.commands["sbatch"]
        counts = runner.submit(late)
        print("--- resumed submit:", counts)
        assert counts["adopted"] == 1 and counts["submitted"] == 0, counts
        assert client.commands["sbatch"] == sbatch_before
        rows = runner.refresh(late)
        assert [r["state"] for r in rows] == [JobState.COMPLETED], rows
        assert len(list(traces.glob("*.trace.json"))) == 1
    finally:
        store.close()

    # --- 3. The controller comes back without its state --------------------------------------
    # Every job is forgotten: the one that finished is judged by its trace (COMPLETED), the
    # ones that were running become LOST; cancel ends a LOST job, retry reruns exactly the
    # LOST and cancelled ones.
    # (its sweep was submitted at the end of part 2)
    atraces = tmp_path / "amnesia" / "traces"
    wait_for(lambda: len(list(atraces.glob("*.heartbeat.json"))) == 3
             and list(atraces.glob("done-*.trace.json")), 120, "done's trace, stuck's beats")
    cluster.ctl("restart-ctld", "--clean")
    rows = sweep_status("amnesia", db, "--outage-limit", 60)
    print("--- after a restart without state:", {k: (r["state"], r["reason"])
                                               for k, r in rows.items()})
    assert {k: r["state"] for k, r in rows.items()} == {
        "done": "COMPLETED", "stuck1": "LOST", "stuck2": "LOST"}, rows
    assert "no record" in rows["stuck1"]["reason"]
    assert "cancelled 1 jobs" in flm("sweep", "cancel", "amnesia", "--db", db,
                                     "--job", "stuck2").stdout
    rows = sweep_status("amnesia", db)
    assert rows["stuck2"]["state"] == "CANCELLED" and rows["stuck1"]["state"] == "LOST"
    retried = flm("sweep", "retry", "amnesia", "--db", db, "--failed-only")
    assert "resubmitted 2 jobs" in retried.stdout, retried.stdout
    rows = sweep_status("amnesia", db)
    assert {k: (r["state"] in ("PENDING", "RUNNING"), r["attempts"]) for k, r in rows.items()} \
        == {"done": (False, 1), "stuck1": (True, 2), "stuck2": (True, 2)}, rows
    assert rows["stuck1"]["earlier"] == "1 LOST" and rows["stuck2"]["earlier"] == "1 CANCELLED"

    # --- 4. A controller that stays away past --outage-limit ----------------------------------
    # status gives up with the states as last seen (exit 4); cancel changes nothing (exit 2).
    pid = int((cluster.directory / "slurmctld.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), 30, "slurmctld to stop")
    out = flm("sweep", "status", "amnesia", "--db", db, "--outage-limit", 2, check=False)
    assert out.returncode == 4, out.stderr
    assert "controller unreachable since" in out.stderr and "as last seen" in out.stderr
    assert out.stdout.count("PENDING") + out.stdout.count("RUNNING") == 2, out.stdout
    out = flm("sweep", "cancel", "amnesia", "--db", db, "--outage-limit", 2, check=False)
    assert out.returncode == 2 and "nothing was changed" in out.stderr, out.stderr
    cluster.ctl("restart-ctld")
    assert "cancelled 2 jobs" in flm("sweep", "cancel", "amnesia", "--db", db).stdout
