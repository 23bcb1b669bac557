"""flm collect --from-logs: the trainers' log parsers on real log text (tests/data/trainer_logs,
each excerpt's source in its SOURCES.md), the traces made from them, and the CLI into a store.

Every figure checked here can be read in the excerpt itself; nothing of the logs is written
here except by cutting, concatenating or prefixing the real excerpts (said where done).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frontier_llm.bench.trace import validate_trace
from frontier_llm.cli import main
from frontier_llm.errors import UserError
from frontier_llm.logs.traces import (
    LogOptions,
    RunRefused,
    build_trace,
    parse_layout_option,
    parse_log,
    run_id,
)
from frontier_llm.trainers.log_reader import WARMUP_STEPS, LogError

DATA = Path(__file__).parent / "data" / "trainer_logs"
GIB = 2**30


def _one(name: str, trainer: str):
    log = parse_log(DATA / name, trainer)  # an absolute name replaces DATA
    assert len(log.runs) == 1
    return log, log.runs[0]


# --- Megatron-LM / Megatron-DeepSpeed --------------------------------------------------------

def test_megatron_iteration_lines_and_a_truncated_last_line():
    """NVIDIA/Megatron-LM#756: three iterations, the fourth cut mid-line in the issue itself."""
    log, run = _one("megatron_lm_756_mixtral_truncated.log", "megatron")
    assert [s.step for s in run.steps] == [71, 72, 73]
    assert [s.time_s for s in run.steps] == pytest.approx([5.3616, 5.4707, 5.8299])
    assert [s.tflops for s in run.steps] == [243.6, 238.7, 224.0]
    assert [s.loss for s in run.steps] == pytest.approx([1.818812, 1.820313, 1.798953])
    assert run.total_steps == 100
    assert log.unreadable == 1  # "iteration 74/ 100 | consumed samples: 9472 | elapse"
    assert run.first_time == "2024-04-06T03:02:12+00:00"
    assert run.last_time == "2024-04-06T03:02:24+00:00"


def test_megatron_arguments_block_states_degrees_and_dtype():
    """NVIDIA/Megatron-LM#91: the world-size line and the start of the arguments block."""
    _, run = _one("megatron_lm_91_arguments.log", "megatron")
    assert run.world_size == 1
    assert {k: run.layout[k] for k in ("dp", "tp", "pp")} == {"dp": 1, "tp": 1, "pp": 1}
    assert run.args["adam_beta2"] == "0.999"
    assert run.args["checkpoint_activations"] == "True"
    assert run.args["bf16"] == "False"
    assert run.steps == []


def test_megatron_older_format_memory_report_and_skipped_iterations():
    """NVIDIA/Megatron-LM#60 (2020): no loss on skipped iterations, the memory report, and an
    iteration line cut after its step time (still readable)."""
    log, run = _one("megatron_lm_60_v100.log", "megatron")
    assert [(s.step, s.time_s, s.loss) for s in run.steps] == [
        (5, 16.4915, None), (10, 1.9939, None), (15, 1.9781, None)]
    assert run.steps[0].memory_bytes == int(12606.06201171875 * 2**20)
    assert log.unreadable == 0


def test_megatron_arguments_to_layout_and_shape(tmp_path):
    """Three real pieces of arguments blocks (#91's header and a..c, Megatron-LLM#70's n..r,
    #516's r..s; concatenated here in the block's alphabetical order) read into the fields they
    state, and nothing else."""
    path = tmp_path / "arguments.log"
    path.write_text("".join((DATA / name).read_text() for name in (
        "megatron_lm_91_arguments.log", "megatron_llm_70_arguments_n_to_r.log",
        "megatron_lm_516_arguments_r_to_s.log")))
    _, run = _one(str(path), "megatron")
    assert run.layout == {"dp": 1, "tp": 1, "pp": 1, "sequence_parallel": False,
                          "recompute": "none", "dtype": "bf16", "engine": "megatron"}
    assert run.model == {"layers": 32, "seq_len": 1024, "position": "rope"}


def test_an_out_of_memory_line_makes_the_run_oom(tmp_path):
    """#449's iterations followed by PyTorch's out-of-memory error as ACEsuit/mace#121 shows it
    (concatenated here)."""
    path = tmp_path / "oom.log"
    path.write_text((DATA / "megatron_lm_449_v100.log").read_text()
                    + (DATA / "torch_oom_mace_121.txt").read_text())
    _, run = _one(str(path), "megatron")
    trace = build_trace(run, path, LogOptions("dgx-a100", "gpt3-350m", parse_layout_option(
        "tp=1,pp=1,dp=64,micro_batch=4,global_batch=256")))
    assert trace["status"] == "oom"
    assert trace["error"].startswith("torch.cuda.OutOfMemoryError: CUDA out of memory.")


def test_megatron_several_runs_in_one_file_and_rank_prefixes(tmp_path):
    """Two real excerpts after an arguments block each (concatenated here: a file of two runs),
    every line printed by two ranks under ``srun --label`` prefixes."""
    args = (DATA / "megatron_lm_91_arguments.log").read_text()
    first = (DATA / "megatron_lm_449_v100.log").read_text()
    second = (DATA / "megatron_llm_11_iterations.log").read_text()
    text = args + first + args + second
    labelled = "".join(f"{rank}: {line}\n" for line in text.splitlines() for rank in (0, 7))
    path = tmp_path / "two-runs.out"
    path.write_text(labelled)
    log = parse_log(path, "megatron")
    assert [[s.step for s in r.steps] for r in log.runs] == [[100, 200], [122, 123, 124, 125]]
    assert [s.time_s for s in log.runs[1].steps] == pytest.approx(
        [86.5452, 87.8716, 89.4748, 89.0752])
    assert log.runs[0].steps[1].loss == pytest.approx(7.803114)
    assert log.unreadable == 0
    # The run_id is the log's path and the run's place in it: stable across re-reads.
    assert run_id(path, 1) == run_id(path, 1) != run_id(path, 0)


def test_megatron_deepspeed_pipeline_lines_and_memory_report():
    """deepspeedai/Megatron-DeepSpeed#199: DeepSpeed's pipeline engine prints the step time."""
    _, run = _one("megatron_deepspeed_199_pipe.log", "deepspeed")
    assert [(s.step, s.time_s, s.loss) for s in run.steps] == [(1, 5.4, 12.6199),
                                                                  (2, 2.673, 12.6157)]
    assert run.steps[0].memory_bytes == int(13808.224609375 * 2**20)  # "max allocated"


# --- torchtitan ------------------------------------------------------------------------------

def test_torchtitan_step_lines():
    """pytorch/torchtitan#1437: steps 3-10, the line after them cut mid-word."""
    _, run = _one("torchtitan_1437_flex_debug.log", "torchtitan")
    assert [s.step for s in run.steps] == list(range(3, 11))
    assert run.steps[0].tokens_per_s == 30768.0  # "tps: 30,768"
    assert run.steps[-1].tflops == 3.54
    assert run.steps[-1].mfu == pytest.approx(0.0036)
    assert run.steps[1].loss == pytest.approx(4.6671)


def test_torchtitan_ranks_printing_the_same_step_count_once():
    """pytorch/torchtitan#2389: seven ranks print step 4; the last line is cut."""
    log, run = _one("torchtitan_2389_ranks.log", "torchtitan")
    assert [s.step for s in run.steps] == [4, 5]
    assert run.steps[0].memory_bytes == int(66.91 * GIB)
    assert run.steps[0].tflops == 314.71  # the first rank's line is the one kept
    assert log.unreadable == 1


def test_torchtitan_model_args_mesh_and_checkpointing():
    """pytorch/torchtitan#1625 (interleaved [rankN]: prefixes) and #171 (the device mesh)."""
    _, run = _one("torchtitan_1625_ranks_model.log", "torchtitan")
    assert run.model == {"hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 8,
                         "vocab": 128256}
    assert run.model_name == "llama3-8B"
    # "Applied selective activation checkpointing" is op-level or every N-th layer (torchtitan's
    # default selective_ac_option is "2"); this log does not print the option: not stated.
    assert run.args["ac"] == "selective" and "recompute" not in run.layout
    _, run = _one("torchtitan_171_mesh.log", "torchtitan")
    assert (run.layout["dp"], run.layout["tp"]) == (2, 2)
    assert run.model["kv_heads"] == run.model["heads"] == 16  # n_kv_heads=None


# --- Context parallelism (issue 30) -----------------------------------------------------------
# No public log with cp > 1 was found for either trainer (searched: Megatron-LM and torchtitan
# issues and pull requests). So cp is read from lines made with the trainers' own print
# statements at the versions docs/export.md cites, each built below from its format string,
# next to the real excerpts (tests/data/trainer_logs/SOURCES.md says so too).

def _megatron_arg(name: str, value: object) -> str:
    """One argument line as megatron/training/arguments.py ``_print_args`` prints it (Megatron-LM
    core_v0.15.3, 309ffca): ``'  {} {} {}'.format(arg, '.' * (48 - len(arg)), value)``."""
    return f"  {name} {'.' * (48 - len(name))} {value}\n"


# arguments.py (core_v0.15.3) ``validate_args``: the world-size line with its cp part.
MEGATRON_WORLD_CP = ("using world size: 8, data-parallel size: 2, context-parallel size: 2, "
                     "hierarchical context-parallel sizes: None, tensor-model-parallel size: 2, "
                     "pipeline-model-parallel size: 1\n")


def test_megatron_reads_cp_from_its_arguments_and_world_line(tmp_path):
    # #91's real arguments block (its own world-size line dropped: its run had no cp) with
    # a documented context_parallel_size line, then #449's real iterations.
    args = (DATA / "megatron_lm_91_arguments.log").read_text().splitlines(keepends=True)
    header = next(i for i, line in enumerate(args) if "arguments" in line)
    text = (MEGATRON_WORLD_CP + "".join(args[1:header + 1])
            + _megatron_arg("context_parallel_size", 2) + "".join(args[header + 1:])
            + (DATA / "megatron_lm_449_v100.log").read_text())
    path = tmp_path / "cp.log"
    path.write_text(text)
    log, run = _one(str(path), "megatron")
    assert {k: run.layout[k] for k in ("dp", "cp", "tp", "pp")} == \
        {"dp": 2, "cp": 2, "tp": 2, "pp": 1}
    assert run.world_size == 8 and log.unreadable == 0
    trace = build_trace(run, path, LogOptions("dgx-a100", "gpt3-350m", parse_layout_option(
        "micro_batch=4,global_batch=256")))
    assert (trace["layout"]["cp"], trace["environment"]["world_size"]) == (2, 8)
    # Without the cp line, the world of 8 is not tp x pp x dp = 4: refused, naming cp.
    path.write_text(text.replace(_megatron_arg("context_parallel_size", 2), "")
                    .replace("context-parallel size: 2", "context-parallel size: 1"))
    _, run = _one(str(path), "megatron")
    with pytest.raises(RunRefused, match="is not tp x cp x pp x dp = 4"):
        build_trace(run, path, LogOptions("dgx-a100", "gpt3-350m", parse_layout_option(
            "micro_batch=4,global_batch=256")))


# torchtitan v0.2.2 (73a0e69) distributed/parallel_dims.py ``build_mesh``, under the prefix its
# real lines carry (#1437); and the older ``Building {n}-D device mesh with {names}, {sizes}``
# (#171's format) with the cp dimension that format names since torchtitan#592.
TITAN_PREFIX = "[rank0]:[titan] 2025-07-21 15:57:41,001 - root - INFO - "
TITAN_MESH_V022 = ("Building device mesh with parallelism: pp=1, dp_replicate=1, dp_shard=2, "
                   "cp=2, tp=1, ep=1, etp=1")
TITAN_MESH_OLD = "Building 2-D device mesh with ['dp_shard', 'cp'], [2, 2]"


@pytest.mark.parametrize("mesh", [TITAN_MESH_V022, TITAN_MESH_OLD])
def test_torchtitan_reads_cp_from_its_mesh_line(tmp_path, mesh):
    path = tmp_path / "cp.log"
    path.write_text(TITAN_PREFIX + mesh + "\n"
                    + (DATA / "torchtitan_1437_flex_debug.log").read_text())
    _, run = _one(str(path), "torchtitan")
    assert (run.layout["dp"], run.layout["cp"]) == (2, 2)
    trace = build_trace(run, path, LogOptions("h100-sxm", "tiny-llama", parse_layout_option(
        "micro_batch=8,global_batch=16")))
    assert trace["layout"]["cp"] == 2 and trace["environment"]["world_size"] == 4
    # tps is per GPU of the cp x tp x pp that share a batch (metrics.py): step 4's 35,051
    # tokens/s on 2 cp ranks is 8 x 32 tokens in 256 / (35,051 x 2) s.
    step4 = next(s for s in trace["steps"] if s["step"] == 4)
    assert step4["time_s"] == pytest.approx(8 * 32 / (35051 * 2))


def test_torchtitan_reads_cp_from_its_printed_job_config(tmp_path):
    # --job.print_config: ``Running with configs: {json.dumps(config, indent=2)}``
    # (config/job_config.py v0.2.2), one key a line; no mesh line here.
    path = tmp_path / "cp.log"
    path.write_text(TITAN_PREFIX + 'Running with configs: {\n  "parallelism": {\n'
                    '    "context_parallel_degree": 4,\n  }\n}\n'
                    + (DATA / "torchtitan_1437_flex_debug.log").read_text())
    _, run = _one(str(path), "torchtitan")
    assert run.layout["cp"] == 4


# --- DeepSpeed -------------------------------------------------------------------------------

def test_deepspeed_config_and_throughput_timer():
    """deepspeedai/DeepSpeed#1825: its printed ZeRO stage and the timer lines of steps 40, 50
    (step 60's timer line is cut off)."""
    _, run = _one("deepspeed_1825_zero2.log", "deepspeed")
    assert run.layout["sharding"] == "zero2"
    assert [s.step for s in run.steps] == [40, 50]
    assert run.steps[0].memory_bytes == int(9.02 * GIB)
    trace = build_trace(run, DATA / "deepspeed_1825_zero2.log", LogOptions(
        "dgx-a100", "gpt3-350m", parse_layout_option("tp=1,pp=1,dp=1,micro_batch=128,"
                                                     "global_batch=128")))
    # The step time is the global batch over the samples per second the timer printed.
    assert [s["time_s"] for s in trace["steps"]] == pytest.approx(
        [128 / 83.48609168106144, 128 / 83.73838805358588])
    assert trace["engine"] == "deepspeed" and trace["layout"]["zero_stage"] == 2


# --- traces ----------------------------------------------------------------------------------

def test_trace_is_valid_with_warmup_dropped_and_status_from_the_log():
    path = DATA / "torchtitan_1437_flex_debug.log"
    _, run = _one(path.name, "torchtitan")
    trace = build_trace(run, path, LogOptions(
        "h100-sxm", "tiny-llama", parse_layout_option("tp=1 pp=1 dp=1 micro_batch=8 "
                                                      "global_batch=8")))
    validate_trace(trace)
    warm = [s["step"] for s in trace["steps"] if s["warmup"]]
    assert warm == [3]  # the first logged step (steps 1..WARMUP_STEPS were not logged)
    assert WARMUP_STEPS == 2
    assert trace["summary"]["steps_measured"] == 7
    # The median of the printed 4..10, kept beside flm's own figure (which it does not replace).
    assert trace["summary"]["trainer_tflops_per_gpu"] == 3.57
    assert trace["status"] == "completed" and trace["engine"] == "native"
    assert trace["labels"]["source"] == "trainer-log"
    assert trace["labels"]["log"] == str(path.resolve())
    # A truncated Megatron log: its steps are measured; a label says where the log stops.
    path = DATA / "megatron_lm_449_v100.log"
    _, run = _one(path.name, "megatron")
    trace = build_trace(run, path, LogOptions("dgx-a100", "gpt3-350m", parse_layout_option(
        "tp=1,pp=1,dp=64,micro_batch=4,global_batch=256")))
    assert trace["status"] == "completed" and trace["labels"]["log_end"] == (
        "cut at step 200 of 500000")
    assert trace["labels"]["sweep"] == "logs-dgx-a100"
    assert [s["warmup"] for s in trace["steps"]] == [True, False]
    assert trace["summary"]["step_time_s"] == pytest.approx(4.2708)
    assert trace["engine"] == "megatron"


def test_what_the_log_does_not_state_is_asked_for(tmp_path):
    path = DATA / "megatron_lm_449_v100.log"
    _, run = _one(path.name, "megatron")
    with pytest.raises(RunRefused, match="give --system NAME --layout"):
        build_trace(run, path, LogOptions(None, "gpt3-350m", {}))
    # The iteration lines print the global batch (256): it is not asked for.
    with pytest.raises(RunRefused, match="does not state tp, pp, dp, micro_batch: give"):
        build_trace(run, path, LogOptions("dgx-a100", "gpt3-350m", {}))
    # The arguments of #91 (dp 1) before the iterations of #449 (concatenated here): a --layout
    # value that contradicts what the log printed is refused, not silently preferred.
    both = tmp_path / "args-then-iterations.log"
    both.write_text((DATA / "megatron_lm_91_arguments.log").read_text() + path.read_text())
    _, run = _one(str(both), "megatron")
    with pytest.raises(RunRefused, match=r"--layout dp=64 contradicts the log \(dp=1\)"):
        build_trace(run, both, LogOptions("dgx-a100", "gpt3-350m", {"dp": 64}))
    with pytest.raises(UserError, match="not FIELD=VALUE"):
        parse_layout_option("tensor=8")


def test_bad_input_refused_in_one_line(tmp_path):
    binary = tmp_path / "core"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8)
    with pytest.raises(LogError, match="binary file"):
        parse_log(binary, "megatron")
    with pytest.raises(LogError, match="--trainer torchtitan"):
        parse_log(DATA / "torchtitan_1437_flex_debug.log", "megatron")
    with pytest.raises(UserError, match="unknown trainer"):
        parse_log(DATA / "torchtitan_1437_flex_debug.log", "nemo")


def test_cli_bad_input_exit_2_one_line(tmp_path, capsys):
    binary = tmp_path / "core"
    binary.write_bytes(b"\x00" * 64)
    db = f"sqlite:///{tmp_path / 'flm.db'}"
    assert main(["collect", "--from-logs", str(binary), "--trainer", "deepspeed",
                 "--db", db, "--traces", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "binary file" in err[0]


def test_cli_stores_runs_that_results_and_validate_see(tmp_path, capsys):
    """Logs -> traces -> the store through flm collect; flm results and flm validate see them,
    and collecting the same logs again stores nothing new (run_ids are stable)."""
    db = f"sqlite:///{tmp_path / 'flm.db'}"
    argv = ["collect", "--from-logs", str(DATA / "torchtitan_1437_flex_debug.log"),
            str(DATA / "torchtitan_1287_steps.log"), "--trainer", "torchtitan",
            "--system", "h100-sxm", "--model", "tiny-llama", "--layout",
            "tp=1,pp=1,dp=1,micro_batch=8,global_batch=8", "--db", db,
            "--traces", str(tmp_path / "traces"), "--quiet"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "read 2 log files (19 lines, 0 unreadable lines skipped): 2 runs, 2 traces" in out
    assert "2 new" in out
    assert main(argv) == 0
    assert "0 new" in capsys.readouterr().out
    assert main(["results", "--db", db, "--format", "json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert len(runs) == 2 and {r["engine"] for r in runs} == {"native"}
    assert main(["validate", "--db", db, "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["runs"]) == 2


def test_calibrate_from_runs_accepts_log_runs(tmp_path, capsys):
    """flm calibrate --from-runs learns from log runs like flm bench runs: their default sweep
    (logs-<system>) selects them. The excerpts print no batch, so the test states two batch
    sizes (two layouts: cross-validation needs two); the figures are the excerpts' own."""
    db = f"sqlite:///{tmp_path / 'flm.db'}"
    for name, batch in (("torchtitan_1437_flex_debug.log", 8), ("torchtitan_1287_steps.log", 16)):
        assert main(["collect", "--from-logs", str(DATA / name), "--trainer", "torchtitan",
                     "--system", "h100-sxm", "--model", "tiny-llama", "--layout",
                     f"tp=1,pp=1,dp=1,micro_batch={batch},global_batch={batch}", "--db", db,
                     "--traces", str(tmp_path / "traces"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["calibrate", "--from-runs", "--sweep", "logs-h100-sxm", "--system",
                 "h100-sxm", "--db", db, "--folds", "2", "--format", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert [row["runs"] for row in summary] == [2, 2]
