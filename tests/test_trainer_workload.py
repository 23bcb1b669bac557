"""Sweeps whose jobs run the user's trainer (issue 29 item 2; frontier_llm/jobs/workload.py and
frontier_llm/logs/job.py). No trainer runs here: the sweep files are refused or rendered and
the rendered text read, and the log-to-trace step reads real public log excerpts
(tests/data/trainer_logs/SOURCES.md)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from frontier_llm.bench.trace import read_trace, trace_path, validate_trace
from frontier_llm.cli import main
from frontier_llm.errors import SpecError
from frontier_llm.jobs.sweepdir import render_sweep
from frontier_llm.jobs.sweepspec import load_sweep
from frontier_llm.logs.job import main as job_main
from frontier_llm.specs.layout import Layout, complete_layout

DATA = Path(__file__).parent / "data" / "trainer_logs"
BASE = "name: t\nmodel: tiny-llama\nsystem: cpu-local\n"


def _sweep(tmp_path: Path, text: str):
    path = tmp_path / "s.yaml"
    path.write_text(BASE + text)
    return load_sweep(path)


def _script(tmp_path: Path, text: str) -> tuple[str, dict]:
    """The rendered script of the sweep's one job, and its manifest row."""
    manifest = render_sweep(_sweep(tmp_path, text), tmp_path / "out")
    job = manifest.jobs[0]
    return (tmp_path / "out" / job["script"]).read_text(), job


@pytest.mark.parametrize("text, match", [
    # A trainer workload without its command: nothing to run.
    ("workload: megatron-lm\nlayouts:\n  - {tp: 1}\n", "needs workload_command"),
    ("workload: nemo\nworkload_command: [python, x.py]\nlayouts:\n  - {tp: 1}\n",
     "unknown workload 'nemo'"),
    # flm bench has its own key for replacing its executable.
    ("workload_command: [python, x.py]\nlayouts:\n  - {tp: 1}\n", "workload_command is for"),
    ("workload: torchtitan\nworkload_command: [python, train.py]\nexecutor: local\n"
     "layouts:\n  - {tp: 1}\n", "executor: slurm only"),
    # flm bench's options would be dropped without a word: refused instead.
    ("workload: torchtitan\nworkload_command: [python, train.py]\nbench_args: {data: x}\n"
     "layouts:\n  - {tp: 1}\n", "bench_args are flm bench options"),
])
def test_workload_keys_refused_in_one_line(tmp_path, text, match):
    with pytest.raises(SpecError, match=match) as info:
        _sweep(tmp_path, text)
    assert "\n" not in str(info.value)


def test_a_layout_the_trainer_cannot_express_is_refused_naming_the_job(tmp_path):
    # selective-op recompute is torchtitan's; Megatron-LM has no such mode (the export's own
    # refusal, at load time, before any job is written).
    text = ("workload: megatron-lm\nworkload_command: [python, pretrain_gpt.py]\n"
            "layouts:\n  - {tp: 1, recompute: selective-op, name: sel}\n")
    with pytest.raises(SpecError, match=r"job sel: megatron-lm cannot run this layout") as info:
        _sweep(tmp_path, text)
    assert "\n" not in str(info.value) and "s.yaml" in str(info.value)


def _task_line(script: str) -> list[str]:
    """The words of the task's case line: the key, the argv (set --) and the after-command."""
    line = next(ln for ln in script.splitlines() if ln.strip().startswith("0) key="))
    lex = shlex.shlex(line.strip()[len("0) "):], posix=True, punctuation_chars=";()")
    lex.whitespace_split = True
    return list(lex)


def test_megatron_lm_job_runs_the_command_with_the_exported_flags(tmp_path):
    from frontier_llm.catalog import load_model
    from frontier_llm.export import megatron_lm_argv

    script, job = _script(tmp_path, "workload: megatron-lm\nworkload_command: [python, "
                          "pretrain_gpt.py]\nlayouts:\n  - {tp: 2, name: a}\n")
    layout = Layout.from_dict(complete_layout({"tp": 2, "dtype": "bf16"}))
    # The exported flags, then the flag that makes Megatron save and stop on SIGTERM.
    flags = [*megatron_lm_argv(load_model("tiny-llama"), layout), "--exit-signal-handler"]
    words = _task_line(script)
    assert words[words.index("--") + 1:words.index("--") + 1 + len(flags)] == flags
    # The launch is not exec'd: the job goes on after the trainer, to write its trace.
    assert "flm-rank python pretrain_gpt.py \"$@\" 2>&1 | (trap '' TERM; exec tee" in script
    assert "\nexec " not in script.split("# --- task ---")[1]
    # The trainer's log becomes the job's trace under the job's run id when it ends.
    assert "python3 -P -m frontier_llm.logs.job" in " ".join(words)
    assert '--run-id "$run_id" --trace-dir "$trace_dir" --exit-code "$rc"' in script
    assert job["argv"] == flags and job["workload"] == "megatron-lm"


@pytest.mark.parametrize("trainer, flags, name", [
    ("torchtitan", ["--job.config_file"], "job_config.toml"),
    ("deepspeed", ["--deepspeed", "--deepspeed_config"], "ds_config.json"),
    ("megatron-deepspeed", ["--deepspeed", "--deepspeed_config"], "ds_config.json"),
])
def test_config_trainers_get_the_file_in_the_job_folder(tmp_path, trainer, flags, name):
    script, job = _script(tmp_path, f"workload: {trainer}\nworkload_command: [torchrun, "
                          "--nproc-per-node, '1', train.py]\nlayouts:\n  - {tp: 1, name: a}\n")
    config = tmp_path / "out" / "jobs" / "a" / name
    assert config.is_file()
    argv = job["argv"]
    i = argv.index(flags[-1])
    assert argv[i - len(flags) + 1:i + 1] == flags and argv[i + 1] == str(config.resolve())
    assert str(config.resolve()) in script and "train.py" in script
    if name.endswith(".json"):
        assert json.loads(config.read_text())["train_micro_batch_size_per_gpu"] >= 1
    else:
        assert "[parallelism]" in config.read_text()


def test_bench_sweeps_render_as_before(tmp_path):
    """A flm bench sweep still execs flm bench (golden scripts: tests/test_jobs_render.py)."""
    script, job = _script(tmp_path, "layouts:\n  - {tp: 1, name: a}\n")
    assert "\nexec " in script and "frontier_llm.logs.job" not in script
    assert "workload" not in job and job["command"] == ["flm", "bench"]


def _job_args(tmp_path: Path, log: Path, layout: Layout, exit_code: int = 0) -> list[str]:
    return ["--trainer", "megatron-lm", "--log", str(log), "--run-id", "a-j42",
            "--trace-dir", str(tmp_path / "traces"), "--exit-code", str(exit_code),
            "--model", "gpt3-350m", "--system", "dgx-a100",
            "--layout-json", json.dumps(layout.to_dict()), "--sweep", "t", "--job-key", "a"]


def test_log_to_trace_keeps_the_jobs_run_id_layout_and_prediction(tmp_path, capsys):
    # NVIDIA/Megatron-LM#449: a cut GPT-350M run on 64 V100s (its own figures).
    layout = Layout.from_dict(complete_layout({"dp": 64, "micro_batch": 4, "global_batch": 256,
                                               "engine": "megatron"}))
    assert job_main(_job_args(tmp_path, DATA / "megatron_lm_449_v100.log", layout)) == 0
    trace = read_trace(trace_path(tmp_path / "traces", "a-j42"))
    validate_trace(trace)
    assert trace["run_id"] == "a-j42" and trace["status"] == "completed"
    assert Layout.from_dict(trace["layout"]) == layout
    assert trace["prediction"] is not None and trace["prediction"]["step_time_s"] > 0
    assert trace["labels"]["sweep"] == "t" and trace["labels"]["job_key"] == "a"
    assert trace["summary"]["step_time_s"] == pytest.approx(4.2708)
    # flm collect stores it like any trace of the sweep's folder.
    db = f"sqlite:///{tmp_path / 'flm.db'}"
    capsys.readouterr()
    assert main(["collect", str(tmp_path / "traces"), "--db", db]) == 0
    assert "1 new" in capsys.readouterr().out


def test_a_failed_trainer_gives_a_failed_or_oom_trace(tmp_path):
    layout = Layout.from_dict(complete_layout({"dp": 64, "micro_batch": 4, "global_batch": 256,
                                               "engine": "megatron"}))
    # An empty log and a non-zero exit: the trainer died before its first step.
    empty = tmp_path / "empty.log"
    empty.write_text("")
    assert job_main(_job_args(tmp_path, empty, layout, exit_code=1)) == 0
    trace = read_trace(trace_path(tmp_path / "traces", "a-j42"))
    assert trace["status"] == "failed" and "exit status 1" in trace["error"]
    assert trace["steps"] == [] and trace["prediction"] is not None
    # Steps, then a non-zero exit: a failure that keeps its measured steps.
    assert job_main(_job_args(tmp_path, DATA / "megatron_lm_449_v100.log", layout, 1)) == 0
    trace = read_trace(trace_path(tmp_path / "traces", "a-j42"))
    assert trace["status"] == "failed" and len(trace["steps"]) == 2


def test_the_walltime_check_counts_the_trainers_own_steps(tmp_path):
    # The steps a Megatron job runs are its --train-iters, not the sweep's steps: 200,000 of
    # them do not fit in 20 minutes, the sweep's 20 would.
    from frontier_llm.jobs.walltime import OvertimeError

    # A space: sweep, whose jobs carry the planner's predicted step time.
    text = ("name: t\nmodel: gpt3-350m\nsystem: frontier\nworkload: megatron-lm\n"
            "workload_command: [python, pretrain_gpt.py, --train-iters, '{n}']\nsteps: 20\n"
            "nodes: [1]\nglobal_batch: 64\nresources: {{account: abc123, time: '00:20:00'}}\n"
            "space: {{tp: [2], pp: [1], micro_batch: [4], zero: [1], engine: [megatron]}}\n")
    spec = tmp_path / "s.yaml"
    spec.write_text(text.format(n=200_000))
    with pytest.raises(OvertimeError, match="200000 steps"):
        render_sweep(load_sweep(spec), tmp_path / "out")
    spec.write_text(text.format(n=20))
    render_sweep(load_sweep(spec), tmp_path / "out2")


def test_a_signalled_trainer_gives_a_timeout_trace_with_its_steps(tmp_path):
    # The job script passes --signal TERM when SLURM ended the job (time limit or scancel; the
    # real run is tests/test_trainer_e2e.py): a timeout, as flm bench writes on SIGTERM,
    # holding the steps printed before, or none.
    layout = Layout.from_dict(complete_layout({"dp": 64, "micro_batch": 4, "global_batch": 256,
                                               "engine": "megatron"}))
    log = DATA / "megatron_lm_449_v100.log"
    assert job_main([*_job_args(tmp_path, log, layout, 143), "--signal", "TERM"]) == 0
    trace = read_trace(trace_path(tmp_path / "traces", "a-j42"))
    assert trace["status"] == "timeout" and "stopped by SIGTERM" in trace["error"]
    assert trace["summary"]["step_time_s"] == pytest.approx(4.2708)
    empty = tmp_path / "empty.log"
    empty.write_text("")
    assert job_main([*_job_args(tmp_path, empty, layout, 143), "--signal", "TERM"]) == 0
    trace = read_trace(trace_path(tmp_path / "traces", "a-j42"))
    assert trace["status"] == "timeout" and trace["steps"] == []
    # Only SLURM's own lines (a job stopped while its ranks met; these are srun's words from
    # such a job here): no run in the log, still a trace that says so.
    srun_only = tmp_path / "srun.log"
    srun_only.write_text("srun: got SIGCONT\nsrun: forcing job termination\n"
                         "srun: error: vm: tasks 0-1: Terminated\n")
    assert job_main([*_job_args(tmp_path, srun_only, layout, 143), "--signal", "TERM"]) == 0
    trace = read_trace(trace_path(tmp_path / "traces", "a-j42"))
    assert trace["status"] == "timeout" and "before a step line" in trace["error"]


def test_the_job_script_runs_the_trainer_then_writes_its_trace(tmp_path):
    """The whole rendered script, with a stand-in srun (runs the rank command once, as SLURM
    task 0) and a stand-in trainer that prints a real torchtitan log (pytorch/torchtitan#1437)
    and checks it was given its config file and the rank variables."""
    import os
    import subprocess
    import sys

    trainer = tmp_path / "train.sh"
    trainer.write_text('#!/bin/bash\n[ "$1" = --job.config_file ] && [ -f "$2" ] || exit 9\n'
                       '[ "$RANK" = 0 ] && [ "$WORLD_SIZE" = 1 ] || exit 8\n'
                       f'cat {DATA / "torchtitan_1437_flex_debug.log"}\n')
    trainer.chmod(0o755)
    _, job = _script(tmp_path, f"workload: torchtitan\nworkload_command: [{trainer}]\n"
                     "layouts:\n  - {tp: 1, micro_batch: 8, global_batch: 8, name: a}\n")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
                                   'SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=1 exec "$@"\n')
    (fake_bin / "scontrol").write_text("#!/bin/bash\necho localhost\n")
    for f in fake_bin.iterdir():
        f.chmod(0o755)
    path = f"{fake_bin}:{Path(sys.executable).parent}:{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "SLURM_JOB_ID": "7"}
    out = subprocess.run(["bash", str(tmp_path / "out" / job["script"])], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    trace = read_trace(trace_path(tmp_path / "out" / "traces", "a-j7"))
    assert trace["status"] == "completed" and trace["labels"]["trainer"] == "torchtitan"
    assert trace["summary"]["steps_measured"] == 7 and trace["prediction"] is not None
    # The sweep's trace folder (the trainer's log lies beside the trace) is collected as is.
    db = f"sqlite:///{tmp_path / 'flm.db'}"
    assert main(["collect", str(tmp_path / "out" / "traces"), "--db", db]) == 0


def test_a_study_file_with_a_workload_gives_trainer_trials(tmp_path):
    """flm tune's trials are one-layout sweeps made from the study file's lines: its workload
    keys reach every trial, so the trials run the trainer and write its traces."""
    from frontier_llm.tune.spec import load_study

    path = tmp_path / "study.yaml"
    path.write_text(BASE.replace("name: t", "name: st") + "workload: torchtitan\n"
                    "workload_command: [python, train.py]\ngpus: [1]\nglobal_batch: 4\n"
                    "study:\n  space:\n    micro_batch: [1, 2]\n  budget: {trials: 2}\n")
    study = load_study(path)
    trial = study.trial_sweep(0, {"tp": 1, "dp": 1, "micro_batch": 2, "global_batch": 4})
    assert trial.spec.workload == "torchtitan" and trial.jobs[0].after
