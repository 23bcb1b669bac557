"""#SBATCH values that could split a directive (issue 31): sbatch's own directive parser
honours ``\\'`` inside single quotes, so shell quoting alone let a value add sbatch options.
Each field now has a conservative character set; these tests hold the validator to it, send the
payload through ``flm sweep render`` from every place a value comes from, and check both the
split and the allowed characters with the real ``sbatch`` of the local SLURM cluster."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from sweep_texts import local_sweep

from frontier_llm.cli import main
from frontier_llm.errors import SpecError
from frontier_llm.jobs.render import Resources
from frontier_llm.jobs.sbatch_values import FIELDS, check, check_path

PAYLOAD = "x\\'\" --export=ALL,LD_PRELOAD=./evil.so #"


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_the_payload_is_refused_in_every_field_naming_it(field):
    value = PAYLOAD if field != "extra_sbatch" else f"--comment={PAYLOAD}"
    with pytest.raises(SpecError) as err:
        check(field, value)
    message = str(err.value)
    assert message.startswith(f"{field}: character ") and "\n" not in message
    assert "LD_PRELOAD" not in message  # the value is not repeated


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("account", "ABC123"),
        ("account", "project_465000"),
        ("partition", "batch,extended"),
        ("qos", "debug"),
        ("constraint", "[rack1*2&rack2*4]"),
        ("constraint", "(knl|haswell)&!x"),
        ("mem", "0"),
        ("mem", "480G"),
        ("time", "1-00:00:00"),
        ("time", "30"),
        ("job_name", "flm-tiny-cpu-g000-n1x4"),
        ("extra_sbatch", "--network=disable_rdzv_get"),
        ("extra_sbatch", "--export=ALL,X=1"),
        ("extra_sbatch", "--gres=gpu:4"),
        ("extra_sbatch", "--signal=B:USR1@60"),
        ("extra_sbatch", "--exclusive"),
    ],
)
def test_ordinary_values_pass(field, value):
    check(field, value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("account", "a b"),
        ("partition", "batch;x"),
        ("mem", "4 G"),
        ("time", "1:00 --x"),
        ("extra_sbatch", "--comment hi"),
        ("extra_sbatch", "--x='y'"),
        ("qos", "q$(id)"),
    ],
)
def test_blanks_quotes_and_shell_are_refused(field, value):
    with pytest.raises(SpecError, match=f"^{field}: "):
        check(field, value)


def test_a_log_path_with_quotes_is_refused():
    check_path("log_pattern", "/scratch/my runs/logs/%a-%A.out")  # a blank is quoted safely
    with pytest.raises(SpecError, match=r"log_pattern: the path holds .*would read as quoting"):
        check_path("log_pattern", "/scratch/a\\'b/%a-%A.out")


def test_resources_check_every_field():
    for field in ("account", "partition", "qos", "constraint", "mem", "time"):
        with pytest.raises(SpecError, match=f"^{field}: "):
            Resources(**{field: PAYLOAD})
    with pytest.raises(SpecError, match=r"^extra_sbatch: "):
        Resources(extra=(f"--comment={PAYLOAD}",))


def _refused(capsys, argv: list[str], field: str) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert f"{field}: character" in err and "LD_PRELOAD" not in err, err


@pytest.mark.parametrize("where", ["sweep", "option", "environment", "extra_sbatch"])
def test_the_payload_is_refused_through_the_cli(tmp_path, capsys, monkeypatch, where):
    extra = ""
    if where == "sweep":
        extra = f"resources: {{account: {json.dumps(PAYLOAD)}}}\n"
    if where == "extra_sbatch":
        extra = f"resources: {{extra_sbatch: [{json.dumps('--comment=' + PAYLOAD)}]}}\n"
    path = tmp_path / "s.yaml"
    path.write_text(local_sweep("split", ["{dp: 1, micro_batch: 2, name: one}"], extra))
    out = tmp_path / "run"
    argv = ["sweep", "render", str(path), "--out", str(out)]
    if where == "option":
        argv += ["--account", PAYLOAD]
    if where == "environment":
        monkeypatch.setenv("FLM_ACCOUNT", PAYLOAD)
    _refused(capsys, argv, "extra_sbatch" if where == "extra_sbatch" else "account")
    assert not out.exists()


def test_a_clean_account_reaches_the_script(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(local_sweep("split", ["{dp: 1, micro_batch: 2, name: one}"]))
    assert (
        main(["sweep", "render", str(path), "--out", str(tmp_path / "run"), "--account", "ABC123"])
        == 0
    )
    [script] = (Path(tmp_path) / "run" / "scripts").iterdir()
    assert "#SBATCH --account=ABC123\n" in script.read_text()


# Every character some field allows, in one free-text option that scontrol shows back.
_ALLOWED = "a1_.,:/=@%+&|[]()*!~^-z"


def _held_job(cluster, tmp_path: Path, directives: list[str]) -> dict[str, str]:
    """Submit a held one-line batch script with ``directives`` to the real SLURM; return what
    scontrol says the job is (its fields), and cancel it."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n" + "".join(f"#SBATCH {d}\n" for d in directives) + "true\n")
    env = cluster.env()
    out = subprocess.run(
        ["sbatch", "--hold", "--parsable", f"--chdir={tmp_path}", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().split(";")[0]
    try:
        shown = subprocess.run(
            ["scontrol", "show", "job", "-o", job],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=True,
        ).stdout
    finally:
        subprocess.run(["scancel", job], env=env, timeout=60)
    return dict(re.findall(r"(\w+)=(\S*)", shown))


@pytest.mark.slurm
@pytest.mark.slow
def test_the_real_sbatch_parser_splits_the_payload_and_reads_allowed_values_whole(
    slurm_cluster, tmp_path
):
    # Why quoting alone was not enough: shlex.quote makes one shell word of the payload, and
    # sbatch's directive parser still ends it at \\' and reads the rest as options of its own.
    split = _held_job(
        slurm_cluster,
        tmp_path,
        [f"--comment={shlex.quote(chr(92) + chr(39) + chr(34) + ' --job-name=pwned #')}"],
    )
    assert split["JobName"] == "pwned"
    # What the validator lets through reaches the job whole, one option each.
    check("extra_sbatch", f"--comment={_ALLOWED}")
    check("account", "acc_1.x-y")
    fields = _held_job(
        slurm_cluster,
        tmp_path,
        [
            f"--comment={shlex.quote(_ALLOWED)}",
            f"--job-name={shlex.quote('flm-a.b_c-g000')}",
            f"--account={shlex.quote('acc_1.x-y')}",
        ],
    )
    assert fields["Comment"] == _ALLOWED
    assert fields["JobName"] == "flm-a.b_c-g000" and fields["Account"] == "acc_1.x-y"
