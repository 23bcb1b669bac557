"""Reading trainer logs the way real runs write them (issues 36, 38 and 40): step times in
seconds under ``srun --label`` prefixes, the global batch the iteration line prints, one trace
builder for every trace, the trainer's TFLOP/s kept beside flm's, warm-up-only runs, folders
with links out and other users' files, huge lines, and every missing option asked at once.

The logs are real (tests/data/trainer_logs, each with its source in SOURCES.md); where a test
changes or combines them it says so. Nothing here is faked: real files, real links, a real
other owner (``os.chown``; the test needs root or skips where it cannot chown, which it says),
the real CLI into a real SQLite store.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sqlite3
import tracemalloc
from pathlib import Path

import pytest

from frontier_llm.bench import record
from frontier_llm.cli import main
from frontier_llm.logs.traces import (
    TFLOPS_AGREEMENT,
    LogOptions,
    RunRefused,
    build_trace,
    logs_to_traces,
    parse_layout_option,
    parse_log,
)
from frontier_llm.trainers.log_reader import MAX_LINE_BYTES, WARMUP_STEPS

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "trainer_logs"
LUMI = DATA / "megatron_deepspeed_lumi_175b_srun_label.log"
BLOOM = DATA / "megatron_deepspeed_bloom_reshaping_seconds.log"
# A log every version of the parsers reads (the defects below are not in reading it).
TITAN = DATA / "torchtitan_1437_flex_debug.log"
TITAN_ARGS = ["--trainer", "torchtitan", "--system", "h100-sxm", "--model", "tiny-llama",
              "--layout", "tp=1,pp=1,dp=1,micro_batch=8,global_batch=8"]
MB = 2**20

# BLOOM-176B's shape (bigscience-workshop/bigscience train/tr11-176B-ml/README.md: 70 layers,
# hidden 14336, 112 heads, sequence 2048, vocabulary 250880 padded for tp); the reshaping log
# prints no arguments block, so the model comes from a file as a user would give it.
BLOOM_YAML = """name: bloom-176b
layers: 70
hidden: 14336
heads: 112
seq_len: 2048
vocab: 250880
"""


def _bloom(tmp_path: Path) -> str:
    path = tmp_path / "bloom-176b.yaml"
    path.write_text(BLOOM_YAML)
    return str(path)


# --- 1. seconds and srun --label --------------------------------------------------------------

def test_megatron_deepspeed_seconds_with_srun_label_prefixes():
    """spyysalo/lumi-llm-scaling 16-node.out: a LUMI Megatron-DeepSpeed job, every line behind
    `srun --label` (`127:  iteration 2/ 143066 | ... elapsed time per iteration (s): 346.58`)."""
    log = parse_log(LUMI, "megatron")
    assert len(log.runs) == 1 and log.unreadable == 0
    run = log.runs[0]
    assert [s.step for s in run.steps] == [1, 2, 3, 4]
    assert [s.time_s for s in run.steps] == pytest.approx([403.07, 346.58, 346.70, 346.67])
    assert [s.tflops for s in run.steps] == [57.65, 67.05, 67.03, 67.03]
    assert run.total_steps == 143066
    assert {k: run.layout[k] for k in ("tp", "pp", "dp", "micro_batch", "global_batch")} == {
        "tp": 8, "pp": 8, "dp": 2, "micro_batch": 2, "global_batch": 1024}
    assert run.world_size == 128 and run.version == "deepspeed 0.8.1"
    assert run.model["layers"] == 70 and run.model["hidden"] == 14336
    # The ranks' memory reports after iteration 1: the largest "max allocated" (ranks 0, 2, 3, 6).
    assert run.steps[0].memory_bytes == int(48803.373046875 * MB)


def test_seconds_log_becomes_a_trace_with_the_median_of_measured_steps(tmp_path):
    run = parse_log(LUMI, "megatron").runs[0]
    trace = build_trace(run, LUMI, LogOptions("lumi-g", "lumi-175b", {}))
    assert [s["warmup"] for s in trace["steps"]] == [True, True, False, False]
    assert trace["summary"]["step_time_s"] == pytest.approx((346.70 + 346.67) / 2)
    assert trace["layout"]["global_batch"] == 1024 and trace["environment"]["world_size"] == 128


# --- 2. the global batch of the iteration line ----------------------------------------------

def test_global_batch_is_read_from_the_iteration_line_and_checked(tmp_path):
    """BigScience's BLOOM reshaping log prints no arguments block: the iteration line's
    `global batch size:  2048` is the run's batch; a --layout that says otherwise is refused."""
    run = parse_log(BLOOM, "megatron").runs[0]
    assert [s.time_s for s in run.steps] == pytest.approx([178.44, 141.94, 141.22])
    assert run.layout["global_batch"] == 2048
    layout = parse_layout_option("tp=2,pp=36,dp=4,micro_batch=1")  # 36 nodes x 8 = 288 GPUs
    trace = build_trace(run, BLOOM, LogOptions("dgx-a100", _bloom(tmp_path), layout))
    assert trace["layout"]["global_batch"] == 2048
    assert trace["summary"]["step_time_s"] == pytest.approx((141.94 + 141.22) / 2)
    run = parse_log(BLOOM, "megatron").runs[0]
    with pytest.raises(RunRefused, match=r"global_batch=1024 contradicts the log "
                                         r"\(global_batch=2048\)"):
        build_trace(run, BLOOM, LogOptions("dgx-a100", _bloom(tmp_path),
                                           {**layout, "global_batch": 1024}))


def test_a_batch_rampup_keeps_only_the_steps_at_the_final_batch(tmp_path):
    """The BLOOM lines with the first one's `global batch size` changed to 1024 (made here: a
    ramp-up's earlier, smaller batch): that step is dropped, the label counts it."""
    text = BLOOM.read_text().replace("global batch size:  2048", "global batch size:  1024", 1)
    path = tmp_path / "rampup.log"
    path.write_text(text)
    run = parse_log(path, "megatron").runs[0]
    assert [s.step for s in run.steps] == [94769, 94770]
    assert run.layout["global_batch"] == 2048
    trace = build_trace(run, path, LogOptions("dgx-a100", _bloom(tmp_path), parse_layout_option(
        "tp=2,pp=36,dp=4,micro_batch=1")))
    assert trace["labels"]["batch_rampup_steps_dropped"] == "1"
    # collect's summary counts the step lines it read but did not store.
    report = logs_to_traces([path], "megatron", LogOptions(
        "dgx-a100", _bloom(tmp_path), parse_layout_option("tp=2,pp=36,dp=4,micro_batch=1")),
        tmp_path / "t")
    assert report.dropped_steps == 1
    assert "1 step lines dropped (no usable step time, or a batch ramp-up's smaller batch)" in (
        report.summary())


# --- 3. one trace builder -------------------------------------------------------------------

def test_every_trace_is_built_by_the_one_builder(tmp_path, monkeypatch):
    """flm bench's skeleton, a log's run and a sweep job that printed no step all go through
    bench.record.trace_record (spied on, the real function still runs)."""
    from frontier_llm.bench.config import BenchConfig
    from frontier_llm.bench.run import skeleton_trace
    from frontier_llm.catalog import load_model, load_system
    from frontier_llm.logs import job, traces
    from frontier_llm.specs.layout import Layout

    calls: list[str] = []
    real = record.trace_record

    def spy(cfg, **kw):
        calls.append(kw["run_id"])
        return real(cfg, **kw)

    for module in (record, traces, job):
        monkeypatch.setattr(module, "trace_record", spy)
    import frontier_llm.bench.run as bench_run
    monkeypatch.setattr(bench_run, "trace_record", spy)

    cfg = BenchConfig(model=load_model("tiny-gpt"), system=load_system("cpu-local"),
                      layout=Layout(global_batch=1, dtype="fp32"), run_id="bench-run")
    skeleton_trace(cfg, 1, "local", "gloo", "cpu", "2026-01-01T00:00:00+00:00")
    run = parse_log(LUMI, "megatron").runs[0]
    log_trace = build_trace(run, LUMI, LogOptions("lumi-g", "lumi-175b", {}))
    (tmp_path / "empty.log").write_text("  0: ------------------------ arguments "
                                        "------------------------\n")
    job.job_trace("megatron-deepspeed", tmp_path / "empty.log", "job-run", 1, "tiny-gpt",
                  "cpu-local", cfg.layout, "s", "k")
    assert calls == ["bench-run", log_trace["run_id"], "job-run"]


def test_no_trace_record_is_written_by_hand_outside_the_builder():
    """The owner test: a trace's schema_version key is written in bench/record.py alone."""
    pkg = ROOT / "frontier_llm"
    writers = [p.relative_to(pkg).as_posix() for p in pkg.rglob("*.py")
               if re.search(r"[\"']schema_version[\"']\s*:", p.read_text())]
    assert writers == ["bench/record.py"]


# --- 4. the trainer's TFLOP/s beside flm's --------------------------------------------------

def test_trainer_tflops_kept_beside_flms_and_a_large_disagreement_flagged(tmp_path):
    # Megatron-DeepSpeed with --checkpoint-activations counts the recomputed forward (an HFU):
    # 67.03 printed against flm's model count; within the stated factor, no flag.
    run = parse_log(LUMI, "megatron").runs[0]
    trace = build_trace(run, LUMI, LogOptions("lumi-g", "lumi-175b", {}))
    s = trace["summary"]
    assert s["trainer_tflops_per_gpu"] == pytest.approx(67.03)
    assert s["model_tflops_per_gpu"] != pytest.approx(67.03)
    # Its `checkpoint_activations True` is full recompute: the printed figure counts the
    # forward twice, 8/6 of flm's model count (within a percent: attention and logits).
    assert trace["layout"]["recompute"] == "full"
    assert s["trainer_tflops_per_gpu"] / s["model_tflops_per_gpu"] == pytest.approx(8 / 6,
                                                                                   rel=0.01)
    assert "tflops_disagree" not in trace["labels"]
    # torchtitan#1437's run printed 3.57 TFLOP/s for its own model; stored as tiny-llama with a
    # batch of 8 it is not that run's FLOP count: both figures kept, the label says so.
    path = DATA / "torchtitan_1437_flex_debug.log"
    run = parse_log(path, "torchtitan").runs[0]
    trace = build_trace(run, path, LogOptions("h100-sxm", "tiny-llama", parse_layout_option(
        "tp=1,pp=1,dp=1,micro_batch=8,global_batch=8")))
    s = trace["summary"]
    assert s["trainer_tflops_per_gpu"] == 3.57
    assert trace["labels"]["trainer_tflops_per_gpu"] == "3.57"
    ratio = s["trainer_tflops_per_gpu"] / s["model_tflops_per_gpu"]
    assert not 1 / TFLOPS_AGREEMENT <= ratio <= TFLOPS_AGREEMENT
    assert "the trainer printed 3.57 TFLOP/s/GPU" in trace["labels"]["tflops_disagree"]


def test_collect_warns_and_validate_says_which_figure_it_uses(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'flm.db'}"
    assert main(["collect", "--from-logs", str(DATA / "torchtitan_1437_flex_debug.log"),
                 "--trainer", "torchtitan", "--system", "h100-sxm", "--model", "tiny-llama",
                 "--layout", "tp=1,pp=1,dp=1,micro_batch=8,global_batch=8", "--db", db,
                 "--traces", str(tmp_path / "t"), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "1 runs whose trainer's TFLOP/s disagrees with flm's" in out
    assert "flm collect: warning:" in err and "the trainer printed 3.57 TFLOP/s/GPU" in err
    assert main(["validate", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "measured_mfu is flm's" in out and "summary.trainer_tflops_per_gpu" in out


# --- 5. a run of warm-up steps only ---------------------------------------------------------

def test_a_two_step_log_is_refused_saying_how_many_steps_it_needs():
    """deepspeedai/Megatron-DeepSpeed#199 logged steps 1 and 2 only: both warm-up. Refused in
    one line (it used to be stored with no step time)."""
    path = DATA / "megatron_deepspeed_199_pipe.log"
    run = parse_log(path, "deepspeed").runs[0]
    with pytest.raises(RunRefused) as refused:
        build_trace(run, path, LogOptions("dgx-a100", "gpt3-350m", parse_layout_option(
            "tp=1,pp=2,dp=1,micro_batch=1,global_batch=8")))
    assert str(refused.value) == (
        f"2 logged steps (1, 2), all warm-up (the first logged step and steps 1-{WARMUP_STEPS} "
        "are not measured): a step time needs a logged step after step 2")


def test_a_sweep_job_of_warm_up_steps_only_says_so_in_a_failed_trace():
    """The same log as a sweep job's trainer log: no step time to store, so the job's trace is
    failed with the refusal as its error (not a completed run with no step time)."""
    from frontier_llm.logs.job import job_trace
    from frontier_llm.specs.layout import Layout

    trace = job_trace("deepspeed", DATA / "megatron_deepspeed_199_pipe.log", "job-1", 0,
                      "gpt3-350m", "dgx-a100", Layout(pp=2, global_batch=8), "s", "k")
    assert trace["status"] == "failed" and trace["summary"]["step_time_s"] is None
    assert trace["error"].startswith("2 logged steps (1, 2), all warm-up")


# --- 6. links out of the folder, other users' files -----------------------------------------

def test_collect_does_not_follow_links_out_of_the_folder(tmp_path, capsys):
    """A folder holding a real log and a link to a private file outside it whose line would
    be read as the run's error: the link is not followed; nothing of it reaches the store."""
    private = tmp_path / "private"
    private.mkdir()
    secret = private / "secret.txt"
    # torchtitan#1437's run with a private error line at its end: were it followed, this file
    # would be a run whose `error` column holds the secret.
    secret.write_text(TITAN.read_text() + "RuntimeError: token=hunter2-private\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "titan.log").write_text(TITAN.read_text())
    (logs / "evil.log").symlink_to(secret)
    (logs / "again.log").symlink_to(logs / "titan.log")  # inside the folder: read
    db = tmp_path / "flm.db"
    assert main(["collect", "--from-logs", str(logs), *TITAN_ARGS, "--db", f"sqlite:///{db}",
                 "--traces", str(tmp_path / "t"), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert f"flm collect: not read {logs / 'evil.log'}: a link out of the folder" in err
    assert "read 2 log files" in out and "1 files not read" in out
    with sqlite3.connect(db) as conn:
        stored = conn.execute("select error, labels_json from flm_runs").fetchall()
    assert stored and not any("hunter2" in str(row) for row in stored)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file another owner needs root (chown)")
def test_other_users_files_are_read_only_with_any_owner(tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    theirs = logs / "colleague.log"
    theirs.write_text(TITAN.read_text())
    os.chown(theirs, 65534, 65534)
    options = LogOptions("h100-sxm", "tiny-llama", parse_layout_option(TITAN_ARGS[-1]))
    report = logs_to_traces([logs], "torchtitan", options, tmp_path / "t")
    assert report.files == 0 and report.skipped == [
        f"{theirs}: owned by another user (uid 65534): --any-owner reads it"]
    report = logs_to_traces([logs], "torchtitan", options, tmp_path / "t", any_owner=True)
    assert report.files == 1 and len(report.traces) == 1
    # Named on the command line, a file is read: the user asked for it.
    assert logs_to_traces([theirs], "torchtitan", options, tmp_path / "t").files == 1


# --- 7 and 8. bounded memory, skipped lines counted -----------------------------------------

def test_a_huge_line_is_skipped_in_bounded_memory_and_counted(tmp_path, capsys):
    """A 20 MB line (no newline for 20 MB: a dumped blob) before torchtitan#1437's lines: the
    line costs no more than the cap in memory, the steps are still read, the summary counts
    it."""
    path = tmp_path / "blob-then-log.log"
    with path.open("w") as f:
        f.write("x" * (20 << 20) + "\n")
        f.write(TITAN.read_text())
    tracemalloc.start()
    log = parse_log(path, "torchtitan")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 << 20  # the cap, the parsed run and imports; reading it whole: 40 MB
    assert log.long_lines == 1 and [s.step for s in log.runs[0].steps] == list(range(3, 11))
    assert main(["collect", "--from-logs", str(path), *TITAN_ARGS, "--db",
                 f"sqlite:///{tmp_path / 'flm.db'}", "--traces", str(tmp_path / "t"),
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "(9 lines, 0 unreadable lines skipped)" in out  # the excerpt's lines
    assert f"1 lines longer than {MAX_LINE_BYTES >> 10} KiB skipped unread" in out


# --- 9. every missing option at once; the docs' example -------------------------------------

def test_every_missing_option_is_asked_for_at_once(tmp_path, capsys):
    path = DATA / "megatron_lm_449_v100.log"
    run = parse_log(path, "megatron").runs[0]
    with pytest.raises(RunRefused) as refused:
        build_trace(run, path, LogOptions())
    # NVIDIA/Megatron-LM#449's iteration lines print `global batch size:   256`: not asked.
    assert str(refused.value) == (
        "the log does not state the system, the model's name, tp, pp, dp, micro_batch: give "
        "--system NAME --model NAME --layout tp=N,pp=N,dp=N,micro_batch=N")
    # The CLI: nothing stored, one line that asks for everything (exit 2). The BLOOM log
    # prints its global batch: it is not asked for.
    assert main(["collect", "--from-logs", str(BLOOM), "--trainer", "megatron",
                 "--db", f"sqlite:///{tmp_path / 'flm.db'}",
                 "--traces", str(tmp_path / "t")]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == ("flm: error: collect --from-logs: nothing stored: 1 run needs what the logs do "
                    "not state: give --system NAME --model NAME --layout "
                    "tp=N,pp=N,dp=N,micro_batch=N")


def test_without_a_trainer_every_option_always_needed_is_asked_at_once(tmp_path, capsys):
    assert main(["collect", "--from-logs", str(LUMI), "--db",
                 f"sqlite:///{tmp_path / 'flm.db'}"]) == 2
    assert capsys.readouterr().err.strip() == (
        "flm: error: collect --from-logs: say which trainer wrote the logs: give --trainer "
        "megatron-lm|megatron-deepspeed|torchtitan|deepspeed --system NAME --model NAME")


def test_the_docs_example_command_works(tmp_path, monkeypatch, capsys):
    """docs/trainer-logs.md's copy-paste example, run as written (from the repository root)
    with its database and trace folder moved into a temporary folder."""
    doc = (ROOT / "docs" / "trainer-logs.md").read_text()
    block = doc.split("<!-- example: collect-from-logs -->", 1)[1].split("```")[1]
    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[:3] == ["flm", "collect", "--from-logs"]
    argv = [a.replace("sqlite:///logs-example.db", f"sqlite:///{tmp_path / 'ex.db'}")
             .replace("log-traces-example", str(tmp_path / "traces")) for a in argv[1:]]
    monkeypatch.chdir(ROOT)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "1 runs, 1 traces written, 0 refused" in out and "1 new" in out
    assert main(["results", "--db", f"sqlite:///{tmp_path / 'ex.db'}", "--format",
                 "json"]) == 0
    (stored,) = json.loads(capsys.readouterr().out)
    assert stored["step_time_s"] == pytest.approx(346.685)  # what the docs say it stores
    assert stored["global_batch"] == 1024 and stored["world_size"] == 128
