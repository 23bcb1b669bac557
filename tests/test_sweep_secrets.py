"""Secrets and sweep files: ``environment.pass_env`` hands variables to the jobs by name, and a
sweep file that writes a credential out is refused at load, naming file, line and key but never
the value (docs/sweeps.md "Secrets")."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from slurm_fixtures import flm, sweep_status, tiny_sweep
from sweep_texts import local_sweep

from frontier_llm.bench.trace import read_trace, trace_path
from frontier_llm.cli import main
from frontier_llm.jobs.secrets import password_url, secret_name

# Strings that must never be written anywhere (sweep folder, output, database).
TOKEN = "wandb-sekrit-4f1d9c"
PASSWORD = "pw-sekrit-77aa"
DB_URL = f"postgresql://flm:{PASSWORD}@db.invalid/flm"

def base(extra: str) -> str:
    return local_sweep("sec", ["{dp: 1, micro_batch: 2, name: one}"], extra)


def _sweep(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(base(extra))
    return path


@pytest.mark.parametrize("name", ["HF_TOKEN", "GITHUB_TOKEN", "WANDB_API_KEY", "PGPASSWORD",
                                  "db_password", "AWS_SECRET_ACCESS_KEY", "MY_PASSWD",
                                  "SSH_PRIVATE_KEY", "APIKEY", "GOOGLE_CREDENTIALS"])
def test_secret_names(name):
    assert secret_name(name)


@pytest.mark.parametrize("name", ["TOKENIZERS_PARALLELISM", "TORCH_EXTENSIONS_DIR", "PWD",
                                  "NCCL_SOCKET_IFNAME", "AWS_ACCESS_KEY_ID", "KEYBOARD",
                                  "FLM_DB", "MONKEY"])
def test_names_that_are_not_secret(name):
    assert not secret_name(name)


def test_password_urls_use_the_stores_rule():
    assert password_url(DB_URL)
    assert password_url(f"--db={DB_URL} --other")
    assert password_url("https://user:p%40ss@host/x")
    for fine in ("postgresql://flm@db/flm", "sqlite:///a:b@c.db", "me@example.org",
                 "https://example.org/a:b", "/path/to/x"):
        assert not password_url(fine), fine


@pytest.mark.parametrize(("extra", "line", "words"), [
    (f"environment:\n  env:\n    OK: 1\n    FLM_DB: '{DB_URL}'\n", 13,
     "environment.env.FLM_DB holds a URL with a password"),
    (f"environment:\n  env: {{WANDB_API_KEY: {TOKEN}}}\n", 11,
     "environment.env.WANDB_API_KEY is named like a secret"),
    (f"labels: {{db: '{DB_URL}'}}\n", 10, "db holds a URL with a password"),
    (f"environment:\n  setup:\n    - export HF_TOKEN={TOKEN}\n", 11,
     "environment.setup sets HF_TOKEN"),
])
def test_a_credential_in_a_sweep_file_is_refused_without_echoing_it(tmp_path, capsys, extra,
                                                                    line, words):
    path = _sweep(tmp_path, extra)
    out = tmp_path / "run"
    assert main(["sweep", "render", str(path), "--out", str(out)]) == 2
    stdout, err = capsys.readouterr()
    assert stdout == "" and err.count("\n") == 1, err
    assert f"{path}:{line}: {words}" in err and "environment.pass_env" in err
    assert TOKEN not in err and PASSWORD not in err
    assert not out.exists()


def test_setup_may_refer_to_a_secret_variable(tmp_path, capsys):
    path = _sweep(tmp_path, 'environment:\n  setup:\n    - export HF_TOKEN="$HF_TOKEN"\n')
    assert main(["sweep", "render", str(path), "--out", str(tmp_path / "run")]) == 0


@pytest.mark.parametrize(("extra", "words"), [
    ("environment:\n  env: {A: 1}\n  pass_env: [A]\n", "A is both in env and pass_env"),
    ("environment:\n  pass_env: [1A]\n", "not a valid variable name"),
    ("resources:\n  extra_sbatch: [--export=NONE]\nenvironment:\n  pass_env: [HF_TOKEN]\n",
     "extra_sbatch --export does not export every pass_env variable"),
])
def test_pass_env_that_cannot_work_is_refused(tmp_path, capsys, extra, words):
    path = _sweep(tmp_path, extra)
    assert main(["sweep", "render", str(path), "--out", str(tmp_path / "run")]) == 2
    assert words in capsys.readouterr().err


def test_export_all_with_names_keeps_pass_env_working(tmp_path):
    path = _sweep(tmp_path, 'resources:\n  extra_sbatch: ["--export=ALL,SWEEP_X=1"]\n'
                            "environment:\n  pass_env: [HF_TOKEN]\n")
    assert main(["sweep", "render", str(path), "--out", str(tmp_path / "run")]) == 0


def test_pass_env_writes_names_only_and_the_job_stops_without_them(tmp_path, monkeypatch):
    """The rendered script and manifest hold the names; the script's environment part, run
    with and without the variable, passes it on or stops with exit 2 naming it (no value)."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    path = _sweep(tmp_path, "environment:\n  pass_env: [HF_TOKEN]\n")
    out = tmp_path / "run"
    assert main(["sweep", "render", str(path), "--out", str(out)]) == 0
    assert json.loads((out / "manifest.json").read_text())["pass_env"] == ["HF_TOKEN"]
    script = next((out / "scripts").glob("*.sh"))
    text = script.read_text()
    assert "HF_TOKEN" in text and TOKEN not in text
    check = subprocess.run(["shellcheck", "--shell=bash", "--severity=style", str(script)],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    part = text.split("# --- environment ---\n", 1)[1].split("# --- end environment ---")[0]
    probe = part + 'printf "%s|%s" "$HF_TOKEN" "$FLM_PASS_ENV"\n'
    seen = subprocess.run(["bash", "-c", probe], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HF_TOKEN": TOKEN})
    assert (seen.returncode, seen.stdout) == (0, f"{TOKEN}|HF_TOKEN")
    lost = subprocess.run(["bash", "-c", probe], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"})
    assert lost.returncode == 2 and lost.stdout == ""
    assert "flm: HF_TOKEN (environment.pass_env) did not reach the job" in lost.stderr


@pytest.mark.parametrize("executor", ["local", "slurm", "--dry-run"])
def test_submit_without_a_pass_env_variable_writes_nothing(tmp_path, capsys, monkeypatch,
                                                           executor):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    path = _sweep(tmp_path, "environment:\n  pass_env: [HF_TOKEN]\n")
    out, db = tmp_path / "run", tmp_path / "flm.db"
    how = ["--dry-run"] if executor == "--dry-run" else ["--executor", executor]
    assert main(["sweep", "submit", str(path), "--out", str(out), "--db", str(db), *how]) == 2
    err = capsys.readouterr().err
    assert err == ("flm: error: environment.pass_env: HF_TOKEN is not set in this shell; "
                   "export it before submitting (the jobs take the values from this shell; "
                   "nothing was submitted)\n")
    assert not out.exists() and not db.exists()


def test_sbatch_export_that_drops_a_pass_env_variable_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("SBATCH_EXPORT", "NONE")
    path = _sweep(tmp_path, "environment:\n  pass_env: [HF_TOKEN]\n")
    out = tmp_path / "run"
    assert main(["sweep", "submit", str(path), "--out", str(out), "--db",
                 str(tmp_path / "flm.db"), "--executor", "slurm"]) == 2
    err = capsys.readouterr().err
    assert "$SBATCH_EXPORT does not export every pass_env variable" in err and TOKEN not in err
    assert not out.exists()


def _nowhere(root: Path, *secrets: str) -> None:
    """No file under ``root`` holds any of ``secrets`` (bytes: the SQLite file too)."""
    for f in root.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            for s in secrets:
                assert s.encode() not in data, f"{s} in {f}"


@pytest.mark.slow
@pytest.mark.slurm
def test_slurm_job_gets_pass_env_values_that_are_written_nowhere(slurm_cluster, tmp_path):
    """A real sbatch (--export=ALL, its default) hands the submitting shell's variables to the
    job: the trace names both; their values are in no file of the sweep folder, no output of
    flm and not in the database."""
    import os

    spec = tmp_path / "sweep.yaml"
    spec.write_text(tiny_sweep("pass-env", ["{dp: 1, micro_batch: 2, name: one}"], steps=2,
                               extra="environment:\n  pass_env: [WANDB_API_KEY, FLM_DB]\n"))
    db = f"sqlite:///{tmp_path}/flm.db"
    out = tmp_path / "run"
    env = {**os.environ, "WANDB_API_KEY": TOKEN, "FLM_DB": DB_URL}
    printed = flm("sweep", "submit", spec, "--out", out, "--db", db, env=env)
    rows = sweep_status("pass-env", db, "--wait", "--timeout", 240, "--max-interval", 2,
                        "--collect", env=env)
    assert rows["one"]["state"] == "COMPLETED", rows
    trace = read_trace(trace_path(out / "traces", rows["one"]["run_id"]))
    assert trace["environment"]["passed_env"] == ["FLM_DB", "WANDB_API_KEY"]
    status = flm("sweep", "status", "pass-env", "--db", db, env=env)
    for text in (printed.stdout, printed.stderr, status.stdout, status.stderr):
        assert TOKEN not in text and PASSWORD not in text
    _nowhere(tmp_path, TOKEN, PASSWORD)


def test_a_study_file_is_held_to_the_same_rule(tmp_path):
    """flm tune's study file is a sweep file with a study block: a credential in its
    environment is refused with the study file's line, and pass_env is kept for its trials."""
    from frontier_llm.errors import SpecError
    from frontier_llm.tune.spec import load_study

    study = base("gpus: [1]\nstudy:\n  space: {micro_batch: [1, 2], zero: [0]}\n"
                              "  budget: {trials: 2}\nenvironment:\n  env:\n"
                              f"    HF_TOKEN: {TOKEN}\n").split("layouts:")[0]
    path = tmp_path / "study.yaml"
    path.write_text(study)
    with pytest.raises(SpecError) as info:
        load_study(path)
    assert str(info.value).startswith(f"{path}:16: environment.env.HF_TOKEN is named like")
    assert TOKEN not in str(info.value)
    path.write_text(study.replace(f"  env:\n    HF_TOKEN: {TOKEN}\n", "  pass_env: [HF_TOKEN]\n"))
    trial = load_study(path).trial_sweep(0, {"dp": 1, "micro_batch": 1})
    assert trial.spec.environment.pass_env == ["HF_TOKEN"]


def test_retry_without_a_pass_env_variable_changes_nothing(tmp_path, capsys, monkeypatch):
    """A local sweep whose jobs ran with the variable; retried without it: one line, exit 2,
    the rows as they were."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    path = _sweep(tmp_path, "command: ['true']\nenvironment:\n  pass_env: [HF_TOKEN]\n")
    db = f"sqlite:///{tmp_path}/flm.db"
    assert main(["sweep", "submit", str(path), "--out", str(tmp_path / "run"), "--db", db]) == 0
    capsys.readouterr()
    assert main(["sweep", "status", "sec", "--db", db, "--format", "json"]) == 0
    before = capsys.readouterr().out
    assert json.loads(before)[0]["state"] == "FAILED"  # no trace: a retry would resubmit it
    monkeypatch.delenv("HF_TOKEN")
    assert main(["sweep", "retry", "sec", "--db", db]) == 2
    assert "HF_TOKEN is not set in this shell" in capsys.readouterr().err
    assert main(["sweep", "status", "sec", "--db", db, "--format", "json"]) == 0
    assert capsys.readouterr().out == before
