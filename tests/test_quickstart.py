"""flm quickstart: the whole loop on this machine. The end-to-end test runs real ``flm bench``
processes (gloo, 1 to 4 CPU ranks) through the local executor into a real SQLite database and a
real Optuna study, interrupts the first run with SIGINT in the middle of its sweep, and checks
that the second run resumes without measuring anything twice. Nothing is faked."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from frontier_llm.cli import build_parser, main
from frontier_llm.quickstart import Settings
from frontier_llm.quickstart.choose import choose
from frontier_llm.quickstart.nextsteps import cluster_steps

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--layouts", "2", "--steps", "2", "--trials", "1"]


def _jobs(db: Path, sweep: str = "quickstart") -> dict[str, tuple[str, str | None, str | None]]:
    """job key -> (state, run id, scheduler id) of the sweep's job rows."""
    with sqlite3.connect(db) as conn:
        try:
            rows = conn.execute(
                "select j.job_key, j.state, j.run_id, j.scheduler_job_id from flm_jobs j "
                "join flm_sweeps s on s.id = j.sweep_id where s.name = ?", (sweep,)).fetchall()
        except sqlite3.OperationalError:  # the tables are not there yet
            return {}
    return {k: (s, r, sid) for k, s, r, sid in rows}


def _completed_runs(db: Path) -> list[tuple[str, str]]:
    """(job key, run id) of every completed run of the quickstart's sweep in flm_runs."""
    with sqlite3.connect(db) as conn:
        return sorted(conn.execute(
            "select job_key, run_id from flm_runs where status = 'completed' and "
            "sweep_name = 'quickstart'").fetchall())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split(") ", 1)[1][0] != "Z"


def _is_png(path: Path) -> bool:
    import matplotlib.image

    if path.read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
        return False
    h, w = matplotlib.image.imread(path).shape[:2]
    return h > 100 and w > 100


def _sigint_default() -> None:
    """In the child, before exec: SIGINT's default action, as at a terminal. A suite started in
    the background by a script has SIGINT ignored, the child would inherit that, and the
    Ctrl-C below would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _home_with_a_clone(tmp_path: Path) -> Path:
    """A folder like ``~`` after ``git clone``: it holds a directory named frontier_llm that is
    not the package (a clone's top level has no __init__.py). ``python -m frontier_llm...``
    started from it imports that folder instead (tests/test_child.py)."""
    home = tmp_path / "home"
    (home / "frontier_llm" / "docs").mkdir(parents=True)
    (home / "frontier_llm" / "README.md").write_text("# frontier_llm\n")
    return home


@pytest.mark.slow
def test_quickstart_runs_the_loop_survives_ctrl_c_and_resumes(tmp_path, capsys):
    """The README's command, ``flm`` by its entry point, started from a folder that holds a
    clone named frontier_llm (issue 40: no child may depend on the folder): calibration ranks,
    flm bench jobs, the refit and the study all run from there, through a Ctrl-C and a resume.
    One quickstart serves both checks; each used to pay for a whole loop of its own."""
    home = _home_with_a_clone(tmp_path)
    entry = str(Path(sys.executable).with_name("flm"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "qs"
    db = out / "flm.db"
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen([entry, "quickstart", "--out", str(out), *SMALL], cwd=home,
                             stdout=log, stderr=subprocess.STDOUT, env=env,
                             preexec_fn=_sigint_default)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and first.poll() is None:
            jobs = _jobs(db) if db.exists() else {}
            if any(s == "COMPLETED" for s, _, _ in jobs.values()):
                break
            time.sleep(0.2)
        assert first.poll() is None, (tmp_path / "first.log").read_text()
        first.send_signal(signal.SIGINT)  # Ctrl-C, mid-sweep: one job done, the next running
        assert first.wait(60) == 130
    finally:
        if first.poll() is None:
            first.kill()
        log.close()
    text = (tmp_path / "first.log").read_text()
    assert "interrupted" in text and f"--out {out}" in text and "--layouts 2" in text

    # The database is consistent: nothing half-written, no job left running or submitting, and
    # the process that Ctrl-C stopped is gone with all its ranks.
    with sqlite3.connect(db) as conn:
        assert conn.execute("pragma integrity_check").fetchone() == ("ok",)
    after_ctrl_c = _jobs(db)
    # COMPLETED, the job Ctrl-C stopped (CANCELLED), and the ones queued behind it, still
    # SUBMITTING with no process (the jobs layer's crash recovery reverts them).
    assert {s for s, _, _ in after_ctrl_c.values()} <= {"COMPLETED", "CANCELLED", "SUBMITTING"}
    assert {s for s, _, _ in after_ctrl_c.values()} & {"CANCELLED", "SUBMITTING"}
    done_before = {k: r for k, (s, r, _) in after_ctrl_c.items() if s == "COMPLETED"}
    assert done_before
    for _, _, sid in after_ctrl_c.values():
        if sid and sid.startswith("local:"):
            assert not _alive(int(sid.split(":")[1]))

    # A second run resumes, from the same folder: what completed keeps its run, the rest runs
    # once, and the whole loop completes.
    resumed = subprocess.run([entry, "quickstart", "--out", str(out), *SMALL], cwd=home,
                             capture_output=True, text=True, timeout=900, env=env)
    second = resumed.stdout
    assert resumed.returncode == 0, second[-3000:] + resumed.stderr[-3000:]
    assert "resuming the quickstart" in second
    # The microbenchmark calibration finished before Ctrl-C: the resume keeps it.
    assert "microbench.yaml: reused" in second
    jobs = _jobs(db)
    assert len(jobs) >= 3  # 2 layouts at 4 ranks and at least one smaller scaling point
    assert all(s == "COMPLETED" for s, _, _ in jobs.values()), jobs
    for key, run_id in done_before.items():
        assert jobs[key][1] == run_id  # not measured again
    runs = _completed_runs(db)
    assert sorted(k for k, _ in runs) == sorted(jobs)  # one completed run per job, no more
    assert f"{len(jobs) - len(done_before)} to run, {len(done_before)} done before" in second

    # The study ran its trial as a real job, warm-started by the model.
    import optuna

    study = optuna.load_study(study_name="quickstart-tune", storage=f"sqlite:///{db}")
    measured = [t for t in study.trials if t.user_attrs.get("flm_outcome") == "measured"]
    # The sweep's 4-rank layouts are told to the study from the store (no job); its one job
    # goes to a layout the sweep did not measure. The warm start is the refitted model's
    # favourite: told as a duplicate of the sweep's run when the sweep measured it (the
    # microbenchmark file chose the sweep's layouts), else it is the job that ran.
    told = [t for t in measured if "flm_from_sweep" in t.user_attrs]
    jobs_run = [t for t in measured if "flm_sweep" in t.user_attrs]
    assert len(told) == 2 and len(jobs_run) == 1 and jobs_run[0].values[0] > 0
    sweep_runs = {r for _, r in runs}
    assert {t.user_attrs["flm_run_id"] for t in told} <= sweep_runs
    assert jobs_run[0].user_attrs["flm_key"] not in {t.user_attrs["flm_key"] for t in told}
    warm = [t for t in study.trials if t.user_attrs.get("flm_warm_start") == 1]
    assert warm
    if warm[0].user_attrs.get("flm_key") in {t.user_attrs["flm_key"] for t in told}:
        assert warm[0].user_attrs.get("flm_outcome") == "duplicate"
    else:
        assert warm[0].number == jobs_run[0].number

    # Files: the plan, the sweep and study files, the reports with valid figures.
    for name in ("plan.csv", "quickstart-sweep.yaml", "quickstart-study.yaml",
                 "quickstart.json"):
        assert (out / name).is_file(), name
    reports = out / "reports"
    for stem in ("quickstart-scaling", "quickstart-layouts", "quickstart-layouts-memory",
                 "quickstart-errors"):
        for ext in ("csv", "md", "pdf"):
            assert (reports / f"{stem}.{ext}").stat().st_size > 0, (stem, ext)
        assert _is_png(reports / f"{stem}.png"), stem
    # The errors report compares the three system files on the same runs, and the refit's
    # scores were printed before the study.
    import pandas as pd

    errors = pd.read_csv(reports / "quickstart-errors.csv")
    assert [s.split(":")[0] for s in errors["system"]] == ["built-in", "microbench", "refit"]
    assert errors["runs"].nunique() == 1 and errors["runs"].iloc[0] == len(jobs) + 1
    assert errors["step_time_mape_pct"].nunique() == 3  # three files, three predictions
    for name in ("microbench.yaml", "refit.yaml"):
        assert (out / "calibration" / name).is_file()
    assert "refit, held out" in second and "refit, in-sample" in second
    # The study predicts with the calibration of lower held-out error, and says which.
    kept = "refit" if "kept the refit" in second else "microbench"
    assert kept == "refit" or "kept the microbenchmark file" in second
    assert str((out / "calibration" / f"{kept}.yaml").resolve()) in \
        (out / "quickstart-study.yaml").read_text()
    assert str((out / "calibration" / "microbench.yaml").resolve()) in \
        (out / "quickstart-sweep.yaml").read_text()
    scaling = (reports / "quickstart-scaling.csv").read_text()
    assert "predicted_efficiency_pct" in scaling and "weak" in scaling
    assert "rank correlation of predicted and measured" in second
    # It ends with where things are and the commands for a cluster.
    assert str(out / "reports") in second and "flm sweep submit" in second

    # A third run measures nothing: the sweep and the study are done.
    trials = len(study.trials)
    assert main(["quickstart", "--out", str(out), *SMALL]) == 0
    third = capsys.readouterr().out
    assert f"0 to run, {len(jobs)} done before" in third
    assert sorted(_completed_runs(db)) == sorted(runs)
    assert len(optuna.load_study(study_name="quickstart-tune",
                                 storage=f"sqlite:///{db}").trials) == trials


def test_the_commands_it_advises_exist_with_those_flags(tmp_path, capsys, monkeypatch):
    """Each printed cluster command parses with flm's own parser, names files that exist, and
    the Frontier sweep it names renders (no cluster needed to render)."""
    steps = cluster_steps()
    assert [s.argv[1] for s in steps][:5] == ["plan", "sweep", "sweep", "sweep", "tune"]
    for step in steps:
        assert step.argv[0] == "flm"
        args = build_parser(step.argv[1]).parse_args(list(step.argv[1:]))
        assert callable(args.func), step.line()
        for word in step.argv:
            if word.endswith(".yaml"):
                assert (ROOT / word).is_file(), word
    monkeypatch.chdir(ROOT)
    render = next(s for s in steps if s.argv[1:3] == ("sweep", "render"))
    argv = list(render.argv[1:])
    argv[argv.index("--out") + 1] = str(tmp_path / "render")
    assert main(argv) == 0
    assert list((tmp_path / "render" / "scripts").glob("*.sh"))
    from frontier_llm.tune.spec import load_study

    study = load_study(ROOT / "sweeps/studies/frontier-22b-tune.yaml")
    assert study.gpus == 16 and study.candidates.feasible()


def test_it_measures_the_fastest_predicted_layout_of_each_shape():
    c = choose(Settings(layouts=4))
    shapes = [(lay.tp, lay.pp) for lay in c.layouts]
    assert len(shapes) == len(set(shapes)) == 4
    tput = list(c.chosen["tokens_per_s"])
    assert tput == sorted(tput, reverse=True)
    assert c.chosen["tokens_per_s"].iloc[0] == c.ranked["tokens_per_s"].max()
    # The scaling series: the first data-parallel layout at fewer ranks, batch per rank kept.
    base = next(lay for lay in c.layouts if lay.dp > 1)
    assert [lay.world_size for lay in c.scaling] == [1, 2]
    for lay in c.scaling:
        assert (lay.tp, lay.pp, lay.micro_batch) == (base.tp, base.pp, base.micro_batch)
        assert lay.global_batch * base.world_size == base.global_batch * lay.world_size


def test_a_folder_made_with_other_settings_is_refused(tmp_path, capsys):
    out = tmp_path / "qs"
    out.mkdir()
    (out / "quickstart.json").write_text(json.dumps(Settings(layouts=3).record()))
    assert main(["quickstart", "--out", str(out), "--layouts", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "layouts=3" in err[0] and "another --out" in err[0]
    assert sorted(p.name for p in out.iterdir()) == ["quickstart.json"]  # nothing written
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "mine.txt").write_text("x")
    assert main(["quickstart", "--out", str(tmp_path / "other")]) == 2
    assert "not a quickstart folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # argparse's type check: exit 2, one line
        main(["quickstart", "--out", str(tmp_path / "new"), "--trials", "0"])
    assert refused.value.code == 2
    assert "--trials must be between 1 and 1,000" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_its_base_system_is_cpu_local_and_takes_another(tmp_path, capsys):
    """The base system is the catalog's cpu-local (the quickstart calibrates it here), and
    --no-calibrate is part of a folder's settings. A --system that does not exist is refused in
    one line before anything is written."""
    assert Settings().system_file.name == "cpu-local.yaml" and Settings().system_file.is_file()
    assert Settings().calibrate and not Settings(calibrate=False).calibrate
    assert Settings().record() != Settings(calibrate=False).record()
    fit = choose(Settings(), "cpu-local-fit")  # the plan takes the file that predicts
    assert fit.ranked["step_time_s"].min() > 2 * choose(Settings()).ranked["step_time_s"].min()
    assert main(["quickstart", "--out", str(tmp_path / "qs"), "--system", "cpu-locl"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cpu-local" in err[0]
    assert not (tmp_path / "qs").exists()


def test_a_folder_whose_sweep_file_another_version_wrote_is_refused(tmp_path, capsys):
    """flm sweep ties a sweep's name to its file: a resume must find the same file, else it
    says why in the quickstart's words, before any job runs."""
    out = tmp_path / "qs"
    out.mkdir()
    (out / "quickstart.json").write_text(json.dumps(Settings().record()))
    (out / "quickstart-sweep.yaml").write_text("name: quickstart\n# an older format\n")
    assert main(["quickstart", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another version of flm quickstart" in err[0]
    assert not (out / "sweep").exists() and not (out / "flm.db").exists()


def test_a_second_quickstart_in_the_same_folder_is_refused_while_one_runs(tmp_path, capsys):
    """Two at once would both run the jobs waiting to run: the second is refused at once."""
    import fcntl

    out = tmp_path / "qs"
    out.mkdir()
    (out / "quickstart.json").write_text(json.dumps(Settings().record()))
    fd = os.open(out / "quickstart.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a running quickstart holds it
        assert main(["quickstart", "--out", str(out)]) == 2
    finally:
        os.close(fd)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another flm quickstart is running" in err[0]
    assert sorted(p.name for p in out.iterdir()) == ["quickstart.json", "quickstart.lock"]


def test_help_documents_the_smaller_settings(capsys):
    with pytest.raises(SystemExit):
        build_parser("quickstart").parse_args(["quickstart", "--help"])
    text = capsys.readouterr().out
    for flag in ("--out", "--system", "cpu-local", "--no-calibrate", "flm calibrate",
                 "--from-runs", "--layouts", "--steps", "--trials", "resume"):
        assert flag in text
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert "quickstart" in sub.choices
