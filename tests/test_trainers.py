"""The trainer registry (frontier_llm/trainers/) and the trainer defects of issues 36, 38 and 39,
each through its consumer: a rendered site job script (its rank command run by a real bash), a
sweep's task environment, an export read back by tomllib, by bash or by DeepSpeed's own config
class, the flm export command line.

No trainer, GPU or Frontier node runs here: the rank command is the real text of the rendered
script, run by bash with the SLURM variables a Frontier task would have (SLURM_LOCALID 5 of a
node whose ranks each see one GCD under --gpu-bind=closest)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from frontier_llm.catalog import load_model
from frontier_llm.cli import main
from frontier_llm.errors import SpecError
from frontier_llm.export import export, layout_for
from frontier_llm.jobs.sweepdir import render_sweep
from frontier_llm.jobs.sweepspec import load_sweep
from frontier_llm.trainers import NAMES, TRAINERS, UnknownTrainer, get
from frontier_llm.trainers.torchtitan import FLAVORS, ffn_width

# A rank's command that prints what the trainer would read: its rank variables and its argv.
PROBE = ["python3", "-c", "import os, sys, json; print(json.dumps({k: os.environ.get(k) for k in "
         "('RANK', 'LOCAL_RANK', 'WORLD_SIZE')} | {'argv': sys.argv[1:]}))"]


ACCOUNTS = {"lumi-g": "project_465000000"}  # the site's account form (site_policy)


def _sweep(tmp_path: Path, system: str, workload: str, layouts: str, command=None,
           name: str = "s.yaml"):
    command = command or PROBE
    text = (f"name: t\nmodel: tiny-llama\nsystem: {system}\nworkload: {workload}\n"
            f"workload_command: {json.dumps(command)}\n"
            f"resources: {{account: {ACCOUNTS.get(system, 'abc123')}, time: '00:30:00'}}\n"
            "layouts:\n" + layouts)
    path = tmp_path / name
    path.write_text(text)
    return load_sweep(path)


def _rendered(tmp_path: Path, system: str, workload: str, layouts: str, command=None):
    out = tmp_path / f"out-{system}-{workload}"
    manifest = render_sweep(_sweep(tmp_path, system, workload, layouts, command), out)
    job = manifest.jobs[0]
    return (out / job["script"]).read_text(), job, out


def _run_rank(job: dict, env: dict[str, str]) -> dict:
    """The job's rank command (as the script's launch line runs it), run by bash."""
    words = list(job["command"]) + list(job["argv"])
    run = subprocess.run(words, env={"PATH": os.environ["PATH"], **env}, capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(run.stdout)


# --- the registry ---

def test_every_trainer_is_registered_once_with_its_spellings():
    assert NAMES == ("megatron-lm", "megatron-deepspeed", "torchtitan", "deepspeed")
    for spelling, name in [("Megatron_LM", "megatron-lm"), ("megatron", "megatron-lm"),
                           ("mds", "megatron-deepspeed"), ("TorchTitan", "torchtitan"),
                           ("ds", "deepspeed")]:
        assert get(spelling).name == name
    with pytest.raises(UnknownTrainer, match="unknown trainer 'nemo' \\(one of megatron-lm"):
        get("nemo")
    for t in TRAINERS.values():  # what each owns is stated, with a source
        assert t.title and t.source and t.engines and t.log_reader.name


# --- a: the rank's device under the site's GPU binding ---

@pytest.mark.parametrize("workload", ["megatron-deepspeed", "torchtitan", "deepspeed",
                                      "megatron-lm"])
def test_frontier_ranks_use_the_one_gcd_they_see(tmp_path, workload):
    """Issue 36 a: under --gpu-bind=closest each rank sees one GCD, index 0; LOCAL_RANK was
    SLURM_LOCALID, so ranks 1-7 asked for a device they cannot see."""
    script, job, _ = _rendered(tmp_path, "frontier", workload,
                               "  - {dp: 8, micro_batch: 1, global_batch: 8, name: a}\n")
    assert "--gpu-bind=closest" in script
    seen = _run_rank(job, {"SLURM_PROCID": "13", "SLURM_LOCALID": "5", "SLURM_NTASKS": "16",
                           "FLM_JOB_DIR": "/j"})
    assert (seen["RANK"], seen["LOCAL_RANK"], seen["WORLD_SIZE"]) == ("13", "0", "16")


def test_lumi_ranks_take_their_own_gcd_of_the_eight_they_see(tmp_path):
    # cpu-masks: every GCD visible, the rank drives SLURM_LOCALID (LUMI AI guide).
    script, job, _ = _rendered(tmp_path, "lumi-g", "megatron-deepspeed",
                               "  - {dp: 8, micro_batch: 1, global_batch: 8, name: a}\n")
    assert "mask_cpu:" in script
    seen = _run_rank(job, {"SLURM_PROCID": "13", "SLURM_LOCALID": "5", "SLURM_NTASKS": "16",
                           "FLM_JOB_DIR": "/j"})
    assert seen["LOCAL_RANK"] == "5"


# --- b: CUDA_DEVICE_MAX_CONNECTIONS wherever the trainer asserts it ---

def _task_env(script: str) -> str:
    return next(ln for ln in script.splitlines() if ln.strip().startswith("0) key="))


@pytest.mark.parametrize("system", ["frontier", "lumi-g", "dgx-h100", "cpu-local"])
@pytest.mark.parametrize("layout, needed", [
    ("{tp: 2, dp: 4, name: a}", True), ("{cp: 2, dp: 4, name: a}", True),
    ("{dp: 8, name: a}", False)])
def test_megatron_lm_sweep_sets_max_connections_on_every_site(tmp_path, system, layout,
                                                              needed):
    """Issue 36 b: validate_args (core_v0.15.3) asserts CUDA_DEVICE_MAX_CONNECTIONS=1 when tp > 1
    or cp > 1; the sweep set it on DGX only, for tp > 1 only."""
    layout = layout.replace("name", "micro_batch: 1, global_batch: 8, name")
    script, _, _ = _rendered(tmp_path, system, "megatron-lm", f"  - {layout}\n")
    assert ("export CUDA_DEVICE_MAX_CONNECTIONS=1;" in _task_env(script)) == needed


def test_megatron_lm_export_states_max_connections():
    model = load_model("tiny-llama")
    text = export("megatron-lm", model, layout_for("megatron-lm", {"dtype": "bf16", "cp": 2,
                                                                   "dp": 2, "global_batch": 4}))
    assert "# required: export CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron-LM core_v0.15.3" in text
    text = export("megatron-lm", model, layout_for("megatron-lm", {"dtype": "bf16", "dp": 2,
                                                                   "global_batch": 4}))
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in text


# --- c: torchtitan's flavors ---

@pytest.mark.parametrize("name, flavor", [("llama3-8b", "8B"), ("llama3-70b", "70B"),
                                          ("llama3-405b", "405B")])
def test_torchtitan_flavor_is_one_torchtitan_registers(name, flavor):
    """Issue 36 c: model.flavor was flm's name (KeyError in torchtitan)."""
    model = load_model(name)
    doc = tomllib.loads(export("torchtitan", model, layout_for("torchtitan", {
        "dtype": "bf16", "dp": 8, "global_batch": 8, "zero": 3})))
    assert doc["model"] == {"name": "llama3", "flavor": flavor}
    dim, layers, heads, kv, mult, multiple = FLAVORS[flavor]
    assert (model.hidden, model.layers, model.heads, model.kv_heads, model.ffn_hidden) == \
        (dim, layers, heads, kv, ffn_width(dim, multiple, mult))


def test_a_model_torchtitan_lacks_gets_its_registration_line():
    model = load_model("tiny-llama")
    text = export("torchtitan", model, layout_for("torchtitan", {"dtype": "bf16", "dp": 2,
                                                                 "global_batch": 2, "zero": 3}))
    assert tomllib.loads(text)["model"]["flavor"] == "tiny-llama"
    line = next(ln for ln in text.splitlines() if "TransformerModelArgs(" in ln)
    args = line.split("TransformerModelArgs(", 1)[1].rstrip(")")
    kw = dict(item.split("=") for item in args.split(", "))
    # The registration gives the model's FFN width through llama3's own rule.
    mult = None if kw["ffn_dim_multiplier"] == "None" else float(kw["ffn_dim_multiplier"])
    assert ffn_width(int(kw["dim"]), int(kw["multiple_of"]), mult) == model.ffn_hidden


def test_a_model_that_is_not_llama_style_is_refused_in_one_line():
    with pytest.raises(Exception, match=r"gelu/layernorm/learned .* no flavor of it is this") \
            as info:
        export("torchtitan", load_model("gpt3-125m"), layout_for("torchtitan", {
            "dtype": "bf16", "dp": 2, "global_batch": 2, "zero": 3}))
    assert "\n" not in str(info.value)


# --- f: torchtitan's implied sequence parallelism ---

def test_megatron_deepspeed_zero3_with_pipelines_gives_deepspeeds_own_reason():
    """Issue 36 f: the refusal named flm's engine rule ("deepspeed does not compose ..."), not
    the assertion DeepSpeed's PipelineEngine makes."""
    with pytest.raises(Exception, match=r"ZeRO-3 with pp 2: its pipeline runs on DeepSpeed's "
                                        r"PipelineEngine, which asserts 'ZeRO-2 and ZeRO-3 are "
                                        r"incompatible with pipeline parallelism'"):
        export("megatron-deepspeed", load_model("tiny-llama"), layout_for(
            "megatron-deepspeed", {"dtype": "bf16", "pp": 2, "dp": 2, "global_batch": 8,
                                   "zero": 3}))


def test_torchtitan_tp_without_sp_is_exported_as_it_runs_and_said(capsys):
    rc = main(["export", "--to", "torchtitan", "--model", "tiny-llama", "--tp", "2", "--dp", "2",
               "--global-batch", "4", "--zero", "3"])
    out, err = capsys.readouterr()
    assert rc == 0 and tomllib.loads(out)["parallelism"]["tensor_parallel_degree"] == 2
    assert "sequence parallelism is implied: torchtitan applies SequenceParallel" in err


def test_torchtitan_sweep_job_without_sp_is_told_it_is_implied(tmp_path):
    with pytest.raises(SpecError, match="sequence parallelism is implied"):
        _sweep(tmp_path, "cpu-local", "torchtitan", "  - {tp: 2, zero: 3, name: a}\n")


# --- g: the pre-deadline signal, one --save per job, the Python environment ---

def test_megatron_jobs_get_sigterm_at_the_sites_lead_and_listen_for_it(tmp_path):
    """Issue 39: USR1 went to the batch shell only; Megatron saves and stops on SIGTERM with
    --exit-signal-handler (arguments.py, training.py)."""
    script, job, _ = _rendered(tmp_path, "frontier", "megatron-deepspeed",
                               "  - {dp: 8, micro_batch: 1, global_batch: 8, name: a}\n")
    assert "#SBATCH --signal=TERM@180\n" in script and "B:USR1" not in script
    assert job["argv"][-1] == "--exit-signal-handler"
    # A trainer without such a handler keeps the batch shell's notice.
    script, job, _ = _rendered(tmp_path, "frontier", "deepspeed",
                               "  - {dp: 8, micro_batch: 1, global_batch: 8, name: a}\n")
    assert "#SBATCH --signal=B:USR1@" in script and "--exit-signal-handler" not in job["argv"]


def test_each_job_gets_its_own_save_directory(tmp_path):
    two = "  - {dp: 8, micro_batch: 1, global_batch: 8, name: a}\n" \
          "  - {dp: 8, micro_batch: 2, global_batch: 16, name: b}\n"
    with pytest.raises(SpecError, match=r"--save /ckpt would be one checkpoint directory for "
                                        r"all 2 jobs; write --save \{job_dir\}/checkpoints"):
        _sweep(tmp_path, "frontier", "megatron-lm", two, [*PROBE, "--save", "/ckpt"])
    manifest = render_sweep(_sweep(tmp_path, "frontier", "megatron-lm", two,
                                   [*PROBE, "--save", "{job_dir}/checkpoints"]), tmp_path / "o")
    saves = set()
    for job in manifest.jobs:
        script = (tmp_path / "o" / job["script"]).read_text()
        line = next(ln for ln in script.splitlines()
                    if ln.strip().startswith(f"{job['index']}) key="))
        job_dir = line.split("export FLM_JOB_DIR=", 1)[1].split(";", 1)[0]
        seen = _run_rank(job, {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "8",
                               "FLM_JOB_DIR": job_dir})
        saves.add(seen["argv"][seen["argv"].index("--save") + 1])
    assert saves == {str(tmp_path / "o" / "jobs" / k / "checkpoints") for k in ("a", "b")}


def test_a_trainer_job_says_which_python_runs_its_trace_step(tmp_path):
    script, _, _ = _rendered(tmp_path, "frontier", "torchtitan",
                             "  - {dp: 8, micro_batch: 1, global_batch: 8, zero: 3, name: a}\n")
    assert "activates no Python environment of its own" in script
    assert "python3 -c 'import frontier_llm' 2>/dev/null || echo" in script


# --- e: nothing the user gave is dropped on export ---

def test_from_plan_keeps_the_plans_sequence_length(capsys):
    rc = main(["export", "--to", "megatron-lm", "--model", "gpt-175b", "--from-plan", "--gpus",
               "1024", "--plan-args", "--seq-len 131072"])
    out, _ = capsys.readouterr()
    assert rc == 0 and "--seq-length 131072 \\\n" in out


@pytest.mark.parametrize("trainer", ["torchtitan", "megatron-lm"])
def test_from_plan_picks_a_layout_the_trainer_runs(capsys, trainer):
    rc = main(["export", "--to", trainer, "--model", "llama3-70b", "--from-plan", "--gpus",
               "256"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.startswith(f"# flm export --to {trainer}: llama3-70b on frontier")


def test_a_tuned_bucket_reaches_the_export(tmp_path, capsys):
    best = tmp_path / "best.yaml"
    best.write_text("layout: {dp: 8, micro_batch: 1, global_batch: 8, zero: 1, dtype: bf16}\n"
                    "bench_args: {bucket_mb: 32}\n")
    assert main(["export", "--to", "deepspeed", "--model", "tiny-llama", "--from-best",
                 str(best)]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["zero_optimization"]["reduce_bucket_size"] == 32 * 2**20 // 2  # bf16 elements
    assert main(["export", "--to", "megatron-lm", "--model", "tiny-llama", "--from-best",
                 str(best)]) == 0
    # Megatron-LM reduces bf16 gradients in fp32 (accumulate_allreduce_grads_in_fp32): 4 bytes
    # an element; the bucket only counts with --overlap-grad-reduce, which the export writes.
    out = capsys.readouterr().out
    assert f"--ddp-bucket-size {32 * 2**20 // 4}" in out and "--overlap-grad-reduce" in out
    best.write_text(best.read_text().replace("zero: 1", "zero: 3"))
    assert main(["export", "--to", "torchtitan", "--model", "tiny-llama", "--from-best",
                 str(best)]) == 0
    # FSDP2 has no bucket size: said, not dropped without a word.
    assert "bucket_mb 32 is not in the export" in capsys.readouterr().err


# --- h: hostile names and paths cannot leave their comment or quotes ---

HOSTILE = "evil\n--load /tmp/x --finetune\r\n# \"'$(touch /tmp/pwned)\u2028x"


def _hostile_model():
    """tiny-llama named HOSTILE. The YAML boundary refuses such a name (specs/values.py,
    tests/test_hostile_boundaries.py); the writers must hold all the same for a ModelSpec made
    some other way, so the name is set past that check here."""
    model = copy.copy(load_model("tiny-llama"))
    object.__setattr__(model, "name", HOSTILE)
    return model


def test_the_boundary_refuses_the_hostile_name():
    with pytest.raises(SpecError):
        replace(load_model("tiny-llama"), name=HOSTILE)


def _argv_by_bash(text: str) -> list[str]:
    """docs/export.md's recipe: from the first line that is not a comment to the end, read by
    the shell as words: eval "set -- $(sed -n '/^[^#]/,$p' FILE)", then "$@"."""
    run = subprocess.run(["bash", "-c", 'eval "set -- $(sed -n \'/^[^#]/,$p\' "$1")"; '
                          'printf "%s\\0" "$@"', "_", "/dev/stdin"],
                         input=text.encode(), capture_output=True, check=True)
    # Bytes, not text mode: text mode would turn the value's \r\n into \n on the way back.
    return run.stdout.decode().split("\0")[:-1]


@pytest.mark.parametrize("trainer", ["megatron-lm", "megatron-deepspeed"])
def test_a_hostile_name_and_path_stay_in_their_place_in_a_flags_file(tmp_path, trainer):
    """Issue 38 item 1: a newline in a model name made a live `--load DIR --finetune` line."""
    model = _hostile_model()
    layout = layout_for(trainer, {"dtype": "bf16", "dp": 2, "global_batch": 2})
    path = f"{tmp_path}/my configs/{HOSTILE}.json"
    text = get(trainer).export_text(model, layout, ds_config_path=path)
    argv = _argv_by_bash(text)
    assert "--finetune" not in argv and "--load" not in argv
    assert not Path("/tmp/pwned").exists()
    assert argv == (get(trainer).flags(model, layout, path) if trainer == "megatron-deepspeed"
                    else get(trainer).flags(model, layout))
    header = [ln for ln in text.splitlines() if ln.startswith("#")]
    assert len(header) >= 2 and "\\n--load /tmp/x --finetune" in header[0]


def test_a_hostile_name_stays_in_its_toml_string_and_comment():
    model = _hostile_model()
    text = export("torchtitan", model, layout_for("torchtitan", {"dtype": "bf16", "dp": 2,
                                                                 "global_batch": 2, "zero": 3}))
    doc = tomllib.loads(text)
    assert doc["model"]["flavor"] == HOSTILE
    assert set(doc) == {"model", "training", "parallelism", "activation_checkpoint", "compile"}
    for line in text.splitlines():
        assert not line.startswith("--") and "\u2028" not in line


# --- 3: the trainer's own config class ---

def test_ds_config_of_a_hostile_name_is_valid_json_read_by_deepspeed(monkeypatch):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    model = _hostile_model()
    cfg = json.loads(export("deepspeed", model, layout_for("deepspeed", {
        "dtype": "bf16", "global_batch": 4, "micro_batch": 4})))
    assert DeepSpeedConfig(cfg).train_batch_size == 4


# --- the log side asks the registry ---

@pytest.mark.parametrize("spelling", ["torchtitan", "titan"])
def test_collect_from_logs_takes_the_export_names_of_a_trainer(tmp_path, capsys, spelling):
    """flm collect --from-logs took parser names only (megatron|torchtitan|deepspeed); a trainer
    is now named as flm export names it, or by an alias, and its log_reader reads its logs."""
    data = Path(__file__).parent / "data" / "trainer_logs" / "torchtitan_1287_steps.log"
    assert main(["collect", "--from-logs", str(data), "--trainer", spelling, "--system",
                 "h100-sxm", "--model", "tiny-llama", "--layout",
                 "tp=1,pp=1,dp=1,micro_batch=16,global_batch=16",
                 "--db", f"sqlite:///{tmp_path / 'flm.db'}", "--traces", str(tmp_path / "t"),
                 "--quiet"]) == 0
    assert "1 new" in capsys.readouterr().out
