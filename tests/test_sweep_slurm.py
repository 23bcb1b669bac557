"""Sweeps end to end on the real one-node SLURM: flm sweep submit/status/cancel/retry running
flm bench in every job (tiny-gpt on CPU ranks over gloo), with faults of every kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slurm_fixtures import flm, sweep_status, tiny_sweep, wait_for
from sqlalchemy import func, select

from frontier_llm.bench.trace import read_trace, trace_path
from frontier_llm.jobs import runner
from frontier_llm.jobs.lifecycle import JobState
from frontier_llm.jobs.slurm import SlurmClient
from frontier_llm.jobs.sweepspec import load_sweep
from frontier_llm.store import open_store
from frontier_llm.store.schema import flm_jobs, flm_runs

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"

FAULTS = tiny_sweep("faults", [
    "{dp: 2, micro_batch: 2, name: ok}",
    "{dp: 2, micro_batch: 2, name: crash, bench_args: {fault: crash, fault_step: 1}}",
    "{dp: 1, micro_batch: 2, name: oom, bench_args: {memory_limit: 100M}}",
    '{dp: 1, micro_batch: 2, name: slow, time: "1", bench_args: {fault: hang, fault_step: 1}}',
    "{dp: 1, micro_batch: 2, name: cancel, bench_args: {fault: hang, fault_step: 1}}"])


def test_tiny_cpu_sweep_end_to_end(slurm_cluster, tmp_path):
    db = f"sqlite:///{tmp_path}/flm.db"
    out = tmp_path / "run"
    sweep = SWEEPS / "tiny-cpu.yaml"
    first = flm("sweep", "submit", sweep, "--out", out, "--db", db)
    assert "submitted 4 jobs" in first.stdout
    again = flm("sweep", "submit", sweep, "--out", out, "--db", db)
    assert "submitted 0 jobs, 4 already submitted" in again.stdout

    status = flm("sweep", "status", "tiny-cpu", "--db", db, "--format", "json", "--wait",
                 "--timeout", 300, "--max-interval", 2, "--collect")
    rows = {r["job_key"]: r for r in json.loads(status.stdout)}
    assert {r["state"] for r in rows.values()} == {"COMPLETED"}, rows
    # What --collect stored, said in a sentence.
    assert f"collected 4 trace files into {db}: 4 new, 0 updated, 0 unchanged, 0 quarantined" \
        in status.stderr
    jobs = load_sweep(sweep).jobs
    assert set(rows) == {j.key for j in jobs}
    for job in jobs:
        trace = read_trace(trace_path(out / "traces", rows[job.key]["run_id"]))
        assert trace["status"] == "completed"
        assert trace["labels"]["sweep"] == "tiny-cpu"
        assert trace["labels"]["job_key"] == job.key
        assert trace["layout"]["tp"] == job.layout.tp and trace["layout"]["dp"] == job.layout.dp
    assert any(j.world_size == 4 for j in jobs)

    # One array per group was submitted, never a second copy.
    arrays = {r["scheduler_job_id"].split("_")[0] for r in rows.values()}
    assert len(arrays) == 3
    store = open_store(db)
    try:
        with store.read() as conn:
            assert conn.execute(select(func.count()).select_from(flm_runs)).scalar_one() == 4
            linked = conn.execute(select(func.count()).select_from(flm_jobs).where(
                flm_jobs.c.layout_id.is_not(None))).scalar_one()
        assert linked == 4
    finally:
        store.close()


def test_faults_are_classified_and_lose_nothing(slurm_cluster, tmp_path):
    """The five faults' verdicts, and what retry and cancel do to them. The slow job runs into
    its one-minute time limit, which SLURM checks every 30 s: a minute or more with nothing to
    do but wait, so the two packed sweeps run in that time, on the same cluster, each with all
    its assertions (``_packed_sweep_judges_each_layout_alone``,
    ``_concurrent_pack_runs_steps_side_by_side``)."""
    db = f"sqlite:///{tmp_path}/flm.db"
    out = tmp_path / "run"
    spec = tmp_path / "faults.yaml"
    spec.write_text(FAULTS)
    flm("sweep", "submit", spec, "--out", out, "--db", db)

    # The hanging jobs stop beating: HUNG while they are still in the queue.
    def hung():
        rows = sweep_status("faults", db, "--hung-after", 3)
        return rows if {rows["slow"]["state"], rows["cancel"]["state"]} == {"HUNG"} else None

    rows = wait_for(hung, 120, "the hanging jobs to be classified HUNG", interval_s=1.0)
    assert "heartbeat" in rows["slow"]["reason"]

    cancelled = flm("sweep", "cancel", "faults", "--db", db, "--job", "cancel")
    assert "cancelled 1 jobs" in cancelled.stdout

    # While the slow job waits for its time limit: the packed sweeps (folders of their own).
    (tmp_path / "packed").mkdir()
    _packed_sweep_judges_each_layout_alone(tmp_path / "packed")
    (tmp_path / "concurrent").mkdir()
    _concurrent_pack_runs_steps_side_by_side(tmp_path / "concurrent")

    rows = sweep_status("faults", db, "--wait", "--timeout", 240, "--max-interval", 2)
    states = {k: r["state"] for k, r in rows.items()}
    assert states == {"ok": "COMPLETED", "crash": "FAILED", "oom": "OOM", "slow": "TIMEOUT",
                      "cancel": "CANCELLED"}, rows
    assert "injected crash" in rows["crash"]["reason"]
    # Where the allocation fails under the limit decides the words (torch's allocator, or
    # Python's MemoryError while the rank writes its trace); the state above is what counts.
    assert any(w in rows["oom"]["reason"] for w in ("allocate memory", "MemoryError"))
    # The faults cost no other job its result.
    ok = read_trace(trace_path(out / "traces", rows["ok"]["run_id"]))
    assert ok["status"] == "completed"
    oom = read_trace(trace_path(out / "traces", rows["oom"]["run_id"]))
    assert oom["status"] == "oom"

    # retry --failed-only resubmits the four faults, never the completed job.
    retried = flm("sweep", "retry", "faults", "--db", db, "--failed-only")
    assert "resubmitted 4 jobs" in retried.stdout
    store = open_store(db)
    try:
        with store.read() as conn:
            attempts = dict(conn.execute(select(flm_jobs.c.job_key, flm_jobs.c.attempts)).all())
    finally:
        store.close()
    assert attempts == {"ok": 1, "crash": 2, "oom": 2, "slow": 2, "cancel": 2}
    flm("sweep", "cancel", "faults", "--db", db)
    # Jobs cancelled while pending are CANCELLED at once (SLURM may forget a cancelled pending
    # array task before anyone asks: they used to stay UNKNOWN, issue 18), so --wait ends.
    out = flm("sweep", "status", "faults", "--db", db, "--format", "json", "--wait",
              "--timeout", 120, "--max-interval", 2, check=False)
    assert out.returncode == 0, out.stderr
    rows = {r["job_key"]: r for r in json.loads(out.stdout)}
    assert rows["ok"]["state"] == "COMPLETED" and rows["ok"]["attempts"] == 1
    assert rows["slow"]["state"] == rows["cancel"]["state"] == "CANCELLED", rows
    # The crash and the oom may have ended on their own before the cancel reached them.
    assert {rows[k]["state"] for k in ("crash", "oom")} <= {"CANCELLED", "FAILED", "OOM"}, rows


def test_sbatch_refusal_records_nothing(slurm_cluster, tmp_path):
    db = f"sqlite:///{tmp_path}/flm.db"
    out = flm("sweep", "submit", SWEEPS / "tiny-cpu.yaml", "--out", tmp_path / "run", "--db", db,
              "--partition", "no-such-partition", check=False)
    assert out.returncode == 2
    assert "invalid partition specified: no-such-partition" in out.stderr
    assert "Traceback" not in out.stderr
    store = open_store(db)
    try:
        with store.read() as conn:
            rows = conn.execute(select(flm_jobs.c.state, flm_jobs.c.scheduler_job_id,
                                       flm_jobs.c.attempts)).all()
    finally:
        store.close()
    assert rows and all(r.state == "RENDERED" and r.scheduler_job_id is None and r.attempts == 0
                        for r in rows)


class _Crash(Exception):
    pass


def test_interrupted_submit_resumes_without_duplicates(slurm_cluster, tmp_path, monkeypatch):
    """The command dies right after sbatch, before recording: the next submit finds the array
    by its comment token and adopts it instead of submitting it again."""
    store = open_store(f"sqlite:///{tmp_path}/flm.db")
    client = SlurmClient(slurm_cluster.env())
    try:
        session = runner.prepare(load_sweep(SWEEPS / "tiny-cpu.yaml"), tmp_path / "run", store,
                                 client=client)

        def die(self, jobs, state):
            raise _Crash()

        monkeypatch.setattr(runner._Recorder, "submitted", die)
        with pytest.raises(_Crash):
            runner.submit(session, hold=True)
        monkeypatch.undo()
        assert {r["state"] for r in session.state.rows()} == {JobState.SUBMITTING}
        sbatch_before = client.commands["sbatch"]
        counts = runner.submit(session, hold=True)
        # The first array (1 job) is adopted; the other groups are submitted once now.
        assert counts["adopted"] == 1 and counts["submitted"] == 3
        assert client.commands["sbatch"] - sbatch_before == 2
        rows = session.state.rows()
        ids = [r["scheduler_job_id"] for r in rows]
        assert len(set(ids)) == 4 and all(ids)
        # Exactly one submission per job in the queue under this test's submit tokens (other
        # tests' tiny-cpu jobs may linger in the queue for MinJobAge).
        found = client.find_by_comment("flm:tiny-cpu:")
        tokens = {found[i].split(":")[2] for i in ids}
        assert len(tokens) == 2  # the interrupted submit's and the resumed one's
        assert sorted(i for i, c in found.items() if c.split(":")[2] in tokens) == sorted(ids)
    finally:
        runner.cancel(session)
        store.close()


def test_wait_timeout_with_jobs_unfinished_exits_4_and_says_how_many(slurm_cluster, tmp_path):
    """Held jobs never start: --wait gives up at its timeout, non-zero, naming the count."""
    db = f"sqlite:///{tmp_path}/flm.db"
    flm("sweep", "submit", SWEEPS / "tiny-cpu.yaml", "--out", tmp_path / "run", "--db", db,
        "--hold")
    try:
        out = flm("sweep", "status", "tiny-cpu", "--db", db, "--wait", "--timeout", 3,
                  "--max-interval", 1, check=False)
        assert out.returncode == 4, out.stderr
        assert "--timeout 3 s passed with 4 of 4 jobs unfinished" in out.stderr
        assert out.stdout.count("PENDING") == 4
    finally:
        flm("sweep", "cancel", "tiny-cpu", "--db", db)


PACKED = tiny_sweep("packed", [
    "{dp: 2, micro_batch: 2, name: first}",
    "{dp: 2, micro_batch: 2, name: crash, bench_args: {fault: crash, fault_step: 1}}",
    "{dp: 2, micro_batch: 2, name: last}"], extra="pack: 3\n")


def _packed_sweep_judges_each_layout_alone(tmp_path: Path) -> None:
    """Three layouts as srun steps of one allocation, the middle one crashing: the others
    complete, every row gets its own verdict and trace, and a retry runs only the crash."""
    db = f"sqlite:///{tmp_path}/flm.db"
    out = tmp_path / "run"
    spec = tmp_path / "packed.yaml"
    spec.write_text(PACKED)
    first = flm("sweep", "submit", spec, "--out", out, "--db", db)
    assert "submitted 3 jobs" in first.stdout

    rows = sweep_status("packed", db, "--wait", "--timeout", 300, "--max-interval", 2, "--collect")
    states = {k: r["state"] for k, r in rows.items()}
    assert states == {"first": "COMPLETED", "crash": "FAILED", "last": "COMPLETED"}, rows
    assert "injected crash" in rows["crash"]["reason"]
    # One allocation (one job id, array task 0), a run id of each layout's own.
    assert len({r["scheduler_job_id"] for r in rows.values()}) == 1
    assert len({r["run_id"] for r in rows.values()}) == 3
    for key in ("first", "last"):
        trace = read_trace(trace_path(out / "traces", rows[key]["run_id"]))
        assert trace["status"] == "completed" and trace["labels"]["job_key"] == key
    assert (out / "traces" / f"{rows['crash']['run_id']}.exit").read_text().strip() != "0"

    results = json.loads(flm("results", "--db", db, "--sweep", "packed", "--format",
                             "json").stdout)
    done = sorted(r["job_key"] for r in results if r["status"] == "completed")
    assert done == ["first", "last"], results

    # A retry runs the crashed layout alone in a new allocation; the others keep their result.
    retried = flm("sweep", "retry", "packed", "--db", db, "--failed-only")
    assert "resubmitted 1 jobs" in retried.stdout
    rows = sweep_status("packed", db, "--wait", "--timeout", 300, "--max-interval", 2)
    assert {k: (r["state"], r["attempts"]) for k, r in rows.items()} == {
        "first": ("COMPLETED", 1), "crash": ("FAILED", 2), "last": ("COMPLETED", 1)}, rows
    job = rows["crash"]["scheduler_job_id"].split("_")[0]
    assert sorted(p.name for p in (out / "traces").glob(f"*-j{job}.exit")) == [
        f"crash-j{job}.exit"]


def _concurrent_pack_runs_steps_side_by_side(tmp_path: Path) -> None:
    """pack_mode concurrent on real SLURM: two 2-rank layouts as srun --exact steps of one
    4-rank allocation, both started before either ended; the crash fails only its own row."""
    db = f"sqlite:///{tmp_path}/flm.db"
    out = tmp_path / "run"
    spec = tmp_path / "concurrent.yaml"
    spec.write_text(PACKED.replace("name: packed", "name: concurrent")
                    .replace("pack: 3", "pack: 2\npack_mode: concurrent"))
    flm("sweep", "submit", spec, "--out", out, "--db", db)
    rows = sweep_status("concurrent", db, "--wait", "--timeout", 300, "--max-interval", 2)
    states = {k: r["state"] for k, r in rows.items()}
    assert states == {"first": "COMPLETED", "crash": "FAILED", "last": "COMPLETED"}, rows
    assert "injected crash" in rows["crash"]["reason"]
    pair = ("first", "crash")
    assert rows["first"]["scheduler_job_id"] == rows["crash"]["scheduler_job_id"]
    assert rows["last"]["scheduler_job_id"] != rows["first"]["scheduler_job_id"]
    traces = out / "traces"
    starts = [(traces / f"{rows[k]['run_id']}.start").stat().st_mtime for k in pair]
    ends = [(traces / f"{rows[k]['run_id']}.exit").stat().st_mtime for k in pair]
    assert max(starts) < min(ends)
    for k in pair:  # neither step waited for the other's share of the allocation
        log = (traces / f"{rows[k]['run_id']}.log").read_text()
        assert "step creation temporarily disabled" not in log, log
