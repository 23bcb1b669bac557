"""flm plan and flm predict from the command line: defaults, formats, every catalog entry, and
one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from frontier_llm.catalog import model_names, system_names
from frontier_llm.cli import main
from frontier_llm.specs import axes


def test_plan_default_is_175b_on_1024_frontier_gcds(capsys):
    assert main(["plan", "--top", "3"]) == 0
    captured = capsys.readouterr()
    assert "gpt-175b on 1024 x AMD MI250X GCD" in captured.err
    lines = captured.out.strip().splitlines()
    assert lines[0].split()[:4] == ["rank", "tp", "pp", "dp"]
    assert len(lines) == 4


def test_plan_json_and_explain(capsys):
    assert main(["plan", "--model", "gpt-1t", "--system", "frontier", "--gpus", "3072",
                 "--top", "5", "--format", "json", "--explain"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["gpus"] == 3072 and len(doc["layouts"]) == 5
    first = doc["layouts"][0]
    assert first["tp"] * first["pp"] * first["dp"] == 3072
    assert first["fits"] is True and first["peak_memory_bytes"] <= 64 * 2**30  # a GCD's 64 GiB
    assert doc["rejected"]["does not fit in memory"] > 0
    assert "Winner:" in captured.err and "rejected" in captured.err
    assert "x the step time" in captured.err


def test_plan_csv_has_every_column(capsys):
    assert main(["plan", "--model", "gpt-22b", "--gpus", "16", "--top", "2",
                 "--format", "csv"]) == 0
    header = capsys.readouterr().out.splitlines()[0].split(",")
    assert {"tp", "pp", "dp", "micro_batch", "sharding", "step_time_s", "mfu",
            "peak_memory_bytes", "reject_reason"} <= set(header)


ENGINES = ("native", "megatron", "deepspeed")


@pytest.mark.parametrize("system", system_names())
@pytest.mark.parametrize("engine", ENGINES)
def test_plan_and_predict_work_for_every_catalog_model(system, engine, capsys):
    """Every catalog model on every catalog system is planned and its winner predicted, each
    (model, system) pair with one of the three engines, rotating so that every engine meets
    every model on a third of the systems and every system with a third of the models (a
    covering of the full product at a third of its cost: the suite's largest module ran the
    whole product)."""
    s, e = system_names().index(system), ENGINES.index(engine)
    for model in [m for j, m in enumerate(model_names()) if (j + s + e) % len(ENGINES) == 0]:
        assert main(["plan", "--model", model, "--system", system, "--gpus", "64",
                     "--top", "1", "--format", "json", "--engine", engine]) in (0, 1), model
        doc = json.loads(capsys.readouterr().out)
        assert doc["evaluated"] > 0
        # The planner's winner (or, when nothing fits, a plain layout) through flm predict.
        best = doc["layouts"][0] if doc["layouts"] else {
            "tp": 1, "pp": 1, "dp": 64, "micro_batch": 1, "global_batch": 64,
            "schedule": "1f1b", "virtual_stages": 1, "recompute": "none"}
        assert best.get("engine", engine) == engine
        argv = ["predict", "--model", model, "--system", system, "--gpus", "64", "--engine",
                engine,
                *(w for a in axes.AXES for w in (f"--{a}", str(best.get(str(a), 1)))),
                "--micro-batch", str(best["micro_batch"]),
                "--global-batch", str(best["global_batch"]), "--schedule", best["schedule"],
                "--virtual-stages", str(best["virtual_stages"]),
                "--recompute", best["recompute"], "--format", "json"]
        if best.get("sequence_parallel"):
            argv.append("--sequence-parallel")
        if best.get("etp"):  # the experts' own tp, where the winner folds them (0: tp)
            argv += ["--etp", str(best["etp"])]
        if best.get("sharding"):
            argv += ["--sharding" if "=" in best["sharding"] else "--zero",
                     best["sharding"].removeprefix("zero")]
        assert main(argv) == 0, (model, argv)
        pred = json.loads(capsys.readouterr().out)
        if doc["layouts"]:
            assert pred["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-9)
            # The winner fits, or is tight (kept, ranked after any that fit).
            assert pred["fits"] is True or best["memory_tight"], (model, best)


def test_predict_json_has_the_promised_keys(capsys):
    assert main(["predict", "--model", "gpt-175b", "--system", "frontier", "--tp", "8",
                 "--pp", "16", "--dp", "8", "--micro-batch", "1", "--global-batch", "1024",
                 "--zero", "1", "--recompute", "selective", "--sequence-parallel",
                 "--schedule", "interleaved", "--virtual-stages", "2", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("step_time_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu",
                "peak_memory_bytes", "fits", "breakdown"):
        assert key in out
    assert out["hardware_tflops_per_gpu"] > out["model_tflops_per_gpu"]
    assert out["layout"]["zero_stage"] == 1
    assert set(out["breakdown"]["time_s"]) >= {"compute", "tp_comm", "pp_bubble", "dp_comm",
                                               "optimizer"}


def test_predict_table(capsys):
    assert main(["predict", "--model", "llama3-8b", "--system", "dgx-h100", "--tp", "2",
                 "--dp", "4", "--global-batch", "64", "--sharding", "p=full,g=full,o=full"]) == 0
    out = capsys.readouterr().out
    assert "zero3" in out and "MFU" in out and "GB peak" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "--model", "gpt-9000"], "unknown model"),
        (["plan", "--system", "summit"], "frontier"),
        (["plan", "--gpus", "7", "--tp", "8"], "tp 8 does not divide the 7 GPUs"),
        (["predict", "--model", "gpt-175b", "--system", "frontier", "--tp", "7"],
         "heads (96) is not divisible by tp (7)"),
        (["predict", "--model", "gpt3-125m", "--system", "frontier", "--tp", "1", "--pp", "13",
          "--global-batch", "13"],
         "leaves a chunk without layers"),
        (["predict", "--model", "gpt-175b", "--system", "frontier", "--tp", "8", "--dp", "2",
          "--gpus", "8"], "does not match the 8 GPUs"),
        (["predict", "--model", "gpt-175b", "--system", "frontier", "--tp", "8",
          "--sharding", "p=sometimes"], "placement"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, message):
    proc = subprocess.run([sys.executable, "-m", "frontier_llm.cli", *argv],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_model_yaml_path_with_error_names_file_and_line(tmp_path):
    bad = tmp_path / "mine.yaml"
    bad.write_text("name: mine\nlayers: 4\nhidden: 64\nheads: 5\nseq_len: 32\nvocab: 100\n")
    proc = subprocess.run([sys.executable, "-m", "frontier_llm.cli", "plan", "--model",
                           str(bad), "--gpus", "4"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "mine.yaml" in proc.stderr and "heads" in proc.stderr


def test_plan_shows_non_dominated_layouts_unless_all(capsys):
    argv = ["plan", "--model", "gpt-22b", "--gpus", "64", "--top", "500", "--format", "csv"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "not dominated" in captured.err and "--all" in captured.err
    frontier = captured.out.strip().splitlines()[1:]
    assert main([*argv, "--all"]) == 0
    every = capsys.readouterr().out.strip().splitlines()[1:]
    assert 1 < len(frontier) < len(every) == 500
    assert frontier[0] == every[0]  # the fastest layout is never dominated


def _best(capsys, *argv: str) -> dict:
    assert main(["plan", "--model", "llama3-8b", "--system", "dgx-h100", "--gpus", "64",
                 "--global-batch", "128", "--tp", "1", "--pp", "1", "--micro-batch", "2",
                 "--recompute", "full", "--top", "1", "--format", "json", *argv]) == 0
    captured = capsys.readouterr()
    return {"layout": json.loads(captured.out)["layouts"][0], "err": captured.err}


def test_eager_prices_pytorch_element_wise_work_and_leaves_megatron_fused(capsys):
    """--eager charges the measured traffic of un-compiled PyTorch's one-kernel-per-op
    element-wise work (costmodel/steptime.py EAGER_BYTES_PER_TOKEN, about 4x the fused
    kernels'): the same native layout takes longer and says so; Megatron-LM layouts run their
    own fused kernels either way."""
    fused = _best(capsys, "--engine", "native", "--zero", "3")
    eager = _best(capsys, "--engine", "native", "--zero", "3", "--eager")
    assert eager["layout"]["step_time_s"] > 1.05 * fused["layout"]["step_time_s"]
    assert eager["layout"]["peak_memory_bytes"] == fused["layout"]["peak_memory_bytes"]
    assert "priced eager (--eager)" in eager["err"] and "eager" not in fused["err"]
    mega = [_best(capsys, "--engine", "megatron", "--zero", "1", *flag)["layout"]
            for flag in ((), ("--eager",))]
    assert mega[0]["step_time_s"] == mega[1]["step_time_s"]


def test_deepspeed_overlap_comm_off_exposes_zero1_and_zero2_reductions(capsys):
    """--deepspeed-overlap-comm off prices DeepSpeed's ZeRO-1/2 as a ds_config without the key
    runs them (DeepSpeed's default below stage 3): the reduction on the compute stream, exposed,
    and ZeRO-2's after every micro-batch (here 2 a step). ZeRO-3 keeps its default (on) and the
    other engines have no such setting: their figures do not move. The header says so."""
    def step(engine, zero, *flag):
        # 256 sequences over dp 64 at micro-batch 2: two micro-batches a step.
        got = _best(capsys, "--engine", engine, "--zero", zero, "--global-batch", "256", *flag)
        return got["layout"]["step_time_s"], got["err"]

    for zero in ("1", "2"):
        on, on_err = step("deepspeed", zero)
        off, off_err = step("deepspeed", zero, "--deepspeed-overlap-comm", "off")
        assert off > on, zero
        assert "without overlap_comm" in off_err and "overlap_comm" not in on_err
    gap1 = step("deepspeed", "1", "--deepspeed-overlap-comm", "off")[0] - step("deepspeed", "1")[0]
    gap2 = step("deepspeed", "2", "--deepspeed-overlap-comm", "off")[0] - step("deepspeed", "2")[0]
    assert gap2 > 1.5 * gap1  # two exposed reductions a step against one
    for engine, zero in (("deepspeed", "3"), ("megatron", "1"), ("native", "3")):
        assert step(engine, zero)[0] == step(engine, zero, "--deepspeed-overlap-comm", "off")[0]


def test_nodes_plans_whole_nodes_and_must_agree_with_gpus(capsys):
    """Frontier users count nodes: --nodes N is N x gpus_per_node GPUs; both given must agree."""
    assert main(["plan", "--nodes", "16", "--model", "gpt-22b", "--top", "1"]) == 0
    assert "gpt-22b on 128 x AMD MI250X GCD (frontier)" in capsys.readouterr().err
    assert main(["plan", "--nodes", "16", "--gpus", "120", "--model", "gpt-22b"]) == 2
    assert "--nodes 16 is 128 GPUs of frontier (8 a node), --gpus says 120" in (
        capsys.readouterr().err)


def test_a_partial_node_count_is_planned_with_a_warning(capsys):
    """1020 GCDs is 127.5 Frontier nodes: the scheduler gives 128, 4 GCDs idle and billed."""
    assert main(["plan", "--gpus", "1020", "--model", "gpt-22b", "--top", "1"]) == 0
    err = capsys.readouterr().err
    assert ("1,020 GPUs is 127.50 nodes of frontier (8 GPUs each): a job gets whole nodes, so "
            "4 GPUs would idle and be billed; --nodes 128 (1,024 GPUs) or --gpus 1016") in err
    assert main(["plan", "--gpus", "6", "--model", "gpt3-1.3b", "--top", "1"]) == 0
    assert "warning" not in capsys.readouterr().err  # within one node: a sub-node job


def test_global_batch_help_states_the_default_it_uses(capsys):
    """The help said "the smallest multiple of --gpus holding 4M tokens": 4,096 sequences of
    gpt-175b on 4,096 GPUs, where the default is 2,048 (the largest divisor of the count up to
    2,048 sequences). It now states the rule default_global_batch applies, with figures."""
    from frontier_llm.catalog import load_model
    from frontier_llm.planner import default_global_batch

    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "smallest multiple of --gpus" not in help_text
    assert "2,048 of gpt-175b on 1,024 or 4,096 GPUs, 3,060 on 1,020" in help_text
    model = load_model("gpt-175b")
    assert [default_global_batch(model, n) for n in (1024, 4096, 1020)] == [2048, 2048, 3060]


def test_a_layout_without_a_pipeline_shows_no_schedule(capsys):
    """``gpipe`` was printed for pp 1, where no schedule runs; now ``-``, and a pipelined row
    keeps its schedule."""
    # The frontier's top 40 holds both kinds (its top 4 are all pipelined since cost model 2.3).
    assert main(["plan", "--model", "gpt-22b", "--gpus", "64", "--top", "40"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    pp1 = [r for r in rows if r[2] == "1"]
    pipelined = [r for r in rows if r[2] != "1"]
    assert pp1 and pipelined
    assert all(r[5] == "-" for r in pp1)
    assert all(r[5] in ("1f1b", "gpipe") or r[5].startswith("interleaved:") for r in pipelined)


def test_the_plan_table_prints_mfu_in_percent_as_every_other_table(capsys):
    """MFU was a fraction in flm plan's table (0.381) and a percentage in flm results, flm
    predict and --explain (38.1 %); the table now prints MFU_% as flm results does. The CSV
    keeps the fraction, as every frame of the API."""
    import io

    import pandas as pd

    assert main(["plan", "--model", "gpt-22b", "--gpus", "64", "--top", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert "MFU_%" in header and "MFU" not in header
    assert main(["plan", "--model", "gpt-22b", "--gpus", "64", "--top", "2",
                 "--format", "csv"]) == 0
    frame = pd.read_csv(io.StringIO(capsys.readouterr().out))
    shown = float(lines[1].split()[header.index("MFU_%")])
    assert 0 < frame["mfu"].iloc[0] < 1 and shown == round(frame["mfu"].iloc[0] * 100, 1)


def test_systems_compare_in_one_table(capsys):
    """Systems could not be compared in one table: --system A,B ranks each as flm plan does
    alone and prints their top rows together, with system and GPU columns (--nodes: the same
    node count of each)."""
    import io

    import pandas as pd

    assert main(["plan", "--model", "llama3-70b", "--system", "frontier,dgx-h100",
                 "--nodes", "32", "--top", "2", "--format", "csv"]) == 0
    both = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert both["system"].tolist() == ["frontier", "frontier", "dgx-h100", "dgx-h100"]
    assert set(both["gpus"]) == {256}
    assert main(["plan", "--model", "llama3-70b", "--system", "dgx-h100", "--nodes", "32",
                 "--top", "2", "--format", "csv"]) == 0
    alone = pd.read_csv(io.StringIO(capsys.readouterr().out))
    h100 = both[both["system"] == "dgx-h100"].reset_index(drop=True)
    assert h100["step_time_s"].tolist() == alone["step_time_s"].tolist()
    assert main(["plan", "--model", "llama3-70b", "--system", "frontier,dgx-h100",
                 "--nodes", "32", "--top", "1"]) == 0
    out = capsys.readouterr()
    assert out.out.split()[:2] == ["system", "gpus"] and "# dgx-h100: 256 x" in out.err


# GPT-3 175B on 256 H100s, Megatron's interleaved schedule (the layout of
# tests/test_costmodel_time.py's p2p test): about 0.9 s of exposed pipeline sends a step.
P2P_LAYOUT = ["--model", "gpt-175b", "--system", "dgx-h100", "--tp", "4", "--pp", "8",
              "--dp", "8", "--micro-batch", "2", "--global-batch", "2048", "--zero", "1",
              "--engine", "megatron"]


def _cli_json(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_overlap_p2p_comm_is_a_flag_of_plan_and_predict(capsys):
    for command in ("plan", "predict"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        assert "--overlap-p2p-comm {on,off}" in out
        assert "--no-overlap-p2p-communication" in " ".join(out.split())


def test_predict_overlap_p2p_comm_hides_interleaved_sends_only(capsys):
    """--overlap-p2p-comm on: Megatron-Core's overlap_p2p_comm, priced for Megatron's
    interleaved schedule (the sends hide behind the chunks' compute: a shorter step, no exposed
    pp_comm here); off is the default. On a layout it cannot change (1F1B, another engine) it
    is refused in one line, not priced as if it had done something."""
    inter = [*P2P_LAYOUT, "--sequence-parallel", "--schedule", "interleaved",
             "--virtual-stages", "6", "--format", "json"]
    off = _cli_json(capsys, ["predict", *inter])
    assert _cli_json(capsys, ["predict", *inter, "--overlap-p2p-comm", "off"]) == off
    on = _cli_json(capsys, ["predict", *inter, "--overlap-p2p-comm", "on"])
    assert off["breakdown"]["time_s"]["pp_comm"] > 0.5
    assert on["breakdown"]["time_s"]["pp_comm"] == 0.0
    assert on["step_time_s"] < off["step_time_s"] - 0.5
    assert on["peak_memory_bytes"] == off["peak_memory_bytes"]  # a schedule, not memory
    for layout in ([*P2P_LAYOUT, "--sequence-parallel"],  # 1F1B
                   [*P2P_LAYOUT[:-2], "--engine", "native", "--schedule", "interleaved",
                    "--virtual-stages", "6"]):
        r = subprocess.run([sys.executable, "-m", "frontier_llm.cli", "predict", *layout,
                            "--overlap-p2p-comm", "on"], capture_output=True, text=True)
        assert r.returncode == 2 and r.stdout == ""
        assert len(r.stderr.strip().splitlines()) == 1
        assert "applies to Megatron-LM's interleaved schedule only" in r.stderr


def test_plan_overlap_p2p_comm_moves_only_megatron_interleaved_layouts(capsys):
    """flm plan prices the flag on the interleaved Megatron layouts and says so in its header;
    a search with none of them (DeepSpeed, or 1F1B only) ranks as without it and says the flag
    had no effect."""
    def best(*argv):
        # P2P_LAYOUT's, as flm plan takes it: 256 GPUs over tp 4 x pp 8 leave dp 8.
        assert main(["plan", "--model", "gpt-175b", "--system", "dgx-h100", "--gpus", "256",
                     "--tp", "4", "--pp", "8", "--micro-batch", "2", "--global-batch", "2048",
                     "--zero", "1", "--recompute", "none", "--include-oom", "--top", "1",
                     "--format", "json", *argv]) == 0
        got = capsys.readouterr()
        return json.loads(got.out)["layouts"][0], got.err

    inter = ("--engine", "megatron", "--sequence-parallel", "on", "--schedule", "interleaved",
             "--virtual-stages", "6")
    off, off_err = best(*inter)
    on, on_err = best(*inter, "--overlap-p2p-comm", "on")
    assert (on["schedule"], on["virtual_stages"]) == ("interleaved", 6)
    assert on["step_time_s"] < off["step_time_s"] - 0.5
    assert "(--overlap-p2p-comm on)" in on_err and "overlap-p2p" not in off_err
    assert "has no effect" not in on_err
    for space in (("--engine", "megatron", "--sequence-parallel", "on", "--schedule", "1f1b"),
                  ("--engine", "deepspeed", "--sequence-parallel", "off")):
        plain, _ = best(*space)
        same, err = best(*space, "--overlap-p2p-comm", "on")
        assert same["step_time_s"] == plain["step_time_s"]
        assert "--overlap-p2p-comm on has no effect here" in err


def test_an_interleaved_pp2_winner_says_megatron_runs_it_only_with_the_overlap(capsys):
    """Megatron-LM asserts pp > 2 for an interleaved schedule without its p2p overlap, and
    flm's export writes the overlap off unless the plan priced it on: a #1 that is interleaved
    over 2 stages says how to price the run Megatron-LM can make of it; priced on, it runs."""
    argv = ["plan", "--model", "gpt3-125m", "--system", "dgx-h100", "--gpus", "16", "--engine",
            "megatron", "--schedule", "interleaved", "--pp", "2", "--top", "1"]
    assert main(argv) == 0
    assert "runs under megatron-lm only with its p2p overlap" in capsys.readouterr().err
    assert main([*argv, "--overlap-p2p-comm", "on"]) == 0
    assert "rank 1 (" not in capsys.readouterr().err


# --- --tp-comm-overlap: Megatron-LM's TP communication/GEMM overlap (costmodel/tp_overlap.py)
# dgx-h100's tp_overlap is 1.0 (the Megatron-LM README's H100 runs state the overlap), so the
# flag moves the step there; most other systems hold 0.0 and would hide nothing.
TP_LAYOUT = [*P2P_LAYOUT, "--sequence-parallel", "--recompute", "none"]


def test_tp_comm_overlap_is_one_flag_of_plan_predict_and_report_plan(capsys):
    """The same --tp-comm-overlap on|off, with the same help, on every command that prices a
    run (cli/overlap_args.py), so a plan's setting can be given again to predict it."""
    from frontier_llm.cli.overlap_args import TP_OVERLAP_HELP

    for command in (["plan"], ["predict"], ["report", "plan"], ["export"]):
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert "--tp-comm-overlap {on,off}" in out
        # argparse wraps at hyphens too: compared without the whitespace.
        assert "".join(TP_OVERLAP_HELP.split()) in "".join(out.split())


def test_predict_tp_comm_overlap_is_the_step_flm_plan_gives(capsys):
    """flm predict with and without --tp-comm-overlap gives the step flm plan ranks for the
    same layout with and without it (before, predict had no such flag and priced every plan's
    layout with its TP collectives exposed); on, the TP collectives hide behind the GEMMs."""
    def planned(*flag):
        # TP_LAYOUT as flm plan's restrict flags: 256 GPUs over tp 4 x pp 8 leave dp 8.
        doc = _cli_json(capsys, [
            "plan", "--model", "gpt-175b", "--system", "dgx-h100", "--gpus", "256", "--tp",
            "4", "--pp", "8", "--micro-batch", "2", "--global-batch", "2048", "--zero", "1",
            "--recompute", "none", "--engine", "megatron", "--sequence-parallel", "on",
            "--schedule", "1f1b", "--include-oom", "--all", "--top", "1", "--format", "json",
            *flag])
        return doc["layouts"][0]

    def predicted(*flag):
        return _cli_json(capsys, ["predict", *TP_LAYOUT, "--format", "json", *flag])

    plan_off, plan_on = planned(), planned("--tp-comm-overlap", "on")
    for row in (plan_off, plan_on):  # the one layout both commands price
        assert (row["tp"], row["pp"], row["dp"], row["micro_batch"], row["schedule"],
                row["recompute"], row["sequence_parallel"]) == (4, 8, 8, 2, "1f1b", "none",
                                                                 True)
    off, on = predicted(), predicted("--tp-comm-overlap", "on")
    assert predicted("--tp-comm-overlap", "off") == off
    assert off["step_time_s"] == pytest.approx(plan_off["step_time_s"], rel=1e-9)
    assert on["step_time_s"] == pytest.approx(plan_on["step_time_s"], rel=1e-9)
    assert on["step_time_s"] < off["step_time_s"] - 1.0
    assert on["breakdown"]["time_s"]["tp_comm"] < 0.5 * off["breakdown"]["time_s"]["tp_comm"]
    assert on["peak_memory_bytes"] == off["peak_memory_bytes"]  # a schedule of kernels
    capsys.readouterr()
    assert main(["predict", *TP_LAYOUT, "--tp-comm-overlap", "on"]) == 0
    assert "(--tp-comm-overlap on)" in capsys.readouterr().out


def test_predict_tp_comm_overlap_refused_where_megatron_does_not_run_it():
    """On a layout Megatron-LM's validate_args would assert on (no sequence parallelism, so
    also tp 1) or another engine, --tp-comm-overlap on is refused in one line, exit 2, as
    --overlap-p2p-comm is: not priced as if it had run."""
    no_sp = [*TP_LAYOUT[:TP_LAYOUT.index("--sequence-parallel")], "--recompute", "none"]
    tp1 = [a if a != "4" else "1" for a in no_sp]  # --tp 4 -> --tp 1 (64 GPUs)
    native = [a if a != "megatron" else "native" for a in TP_LAYOUT]
    for layout, words in ((no_sp, "sequence parallelism off"), (tp1, "tp 1"),
                          (native, "engine native")):
        r = subprocess.run([sys.executable, "-m", "frontier_llm.cli", "predict", *layout,
                            "--tp-comm-overlap", "on"], capture_output=True, text=True)
        assert r.returncode == 2 and r.stdout == "", r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        assert "applies to Megatron-LM with sequence parallelism only" in r.stderr
        assert words in r.stderr
        assert "only when sequence parallelism is enabled" in r.stderr  # Megatron's words


def test_plan_tp_comm_overlap_says_where_it_cannot_act(capsys):
    """flm plan --tp-comm-overlap on over a search with no Megatron TP layout with sequence
    parallelism ranks as without it and says so; a #1 without sequence parallelism is priced
    as Megatron-LM runs it, without the overlap (Megatron asserts sequence parallelism for
    it), and is named, as flm export --from-plan skips it."""
    def best(*argv):
        assert main(["plan", "--model", "gpt3-125m", "--system", "dgx-h100", "--gpus", "16",
                     "--top", "1", "--format", "json", *argv]) == 0
        got = capsys.readouterr()
        return json.loads(got.out)["layouts"][0], got.err

    plain, _ = best("--engine", "deepspeed")
    same, err = best("--engine", "deepspeed", "--tp-comm-overlap", "on")
    assert same["step_time_s"] == plain["step_time_s"]
    assert "--tp-comm-overlap on has no effect here" in err
    off, _ = best("--engine", "megatron", "--tp", "2", "--sequence-parallel", "off")
    row, err = best("--engine", "megatron", "--tp", "2", "--sequence-parallel", "off",
                    "--tp-comm-overlap", "on")
    assert row["tp"] == 2 and not row["sequence_parallel"]
    assert row["step_time_s"] == off["step_time_s"]  # no overlap priced without SP
    assert "priced without --tp-comm-overlap, which Megatron-LM runs only with sequence" in err
    assert "--tp-comm-overlap on has no effect here" in err
    row, err = best("--engine", "megatron", "--tp", "2", "--sequence-parallel", "on",
                    "--tp-comm-overlap", "on")
    assert "(--tp-comm-overlap on)" in err and "has no effect" not in err
    assert "runs only with sequence parallelism" not in err


def _record_plans(monkeypatch) -> list[dict]:
    """Every planner.plan call flm plan's paths make, by its keywords (the real plan runs)."""
    from frontier_llm.cli import allocation as alloc_cli
    from frontier_llm.cli import plan as plan_cli
    from frontier_llm.planner import plan as real_plan

    calls: list[dict] = []

    def recording(*args, **kwargs):
        calls.append(kwargs)
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(plan_cli, "plan", recording)
    monkeypatch.setattr(alloc_cli, "plan", recording)
    return calls


def test_min_gpus_prices_every_run_setting(capsys, monkeypatch):
    """--min-gpus planned without --overlap-p2p-comm, --tp-comm-overlap, --eager and
    --deepspeed-overlap-comm: each of its plans now gets every run setting the flags give."""
    calls = _record_plans(monkeypatch)
    assert main(["plan", "--model", "gpt-22b", "--system", "dgx-h100", "--gpus", "64",
                 "--engine", "megatron", "--min-gpus", "--overlap-p2p-comm", "on",
                 "--tp-comm-overlap", "on", "--eager", "--deepspeed-overlap-comm", "off",
                 "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["min_gpus"][0]["min_gpus"] is not None
    assert len(calls) >= 2
    for kw in calls:
        assert kw["p2p_overlap"] is True and kw["tp_comm_overlap"] is True, kw
        assert kw["eager"] is True and kw["overlap_comm"] is False, kw


def test_compared_systems_price_the_moe_run_settings(capsys, monkeypatch):
    """--system A,B dropped --moe-overlap and --moe-dispatcher: each system's rows are now the
    ones flm plan --system NAME gives with the same flags."""
    import io

    import pandas as pd

    from frontier_llm.costmodel.moe import MoeRun

    calls = _record_plans(monkeypatch)
    flags = ["--model", "mixtral-8x7b", "--nodes", "4", "--engine", "megatron",
             "--moe-overlap", "ep-a2a", "--moe-dispatcher", "flex", "--top", "3",
             "--format", "csv"]
    assert main(["plan", "--system", "dgx-h100,dgx-a100", *flags]) == 0
    both = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert [kw["moe_run"] for kw in calls] == [MoeRun("ep-a2a", "flex")] * 2
    assert main(["plan", "--system", "dgx-h100", *flags]) == 0
    alone = pd.read_csv(io.StringIO(capsys.readouterr().out))
    h100 = both[both["system"] == "dgx-h100"].reset_index(drop=True)
    assert h100["step_time_s"].tolist() == alone["step_time_s"].tolist()


def test_one_place_builds_every_run_setting_plan_takes():
    """planner/run_settings.py's RunSettings gives every keyword of planner.plan that is a run
    setting (all but the calibration-only ones), the curve and --fp8-speedup take the same, and
    cli/run_settings.py reads a flag for each of its fields: a setting added to the planner
    must be added there, where every flm plan path (and the Python API) reads it."""
    import argparse
    import dataclasses
    import inspect

    from frontier_llm.cli.run_settings import READERS, run_settings
    from frontier_llm.planner import plan as plan_fn
    from frontier_llm.planner.allocation import allocation_curve
    from frontier_llm.planner.plan import in_dtype
    from frontier_llm.planner.run_settings import CALIBRATION_ONLY, RunSettings

    assert set(READERS) == {f.name for f in dataclasses.fields(RunSettings)}
    given = set(run_settings(argparse.Namespace()))
    params = list(inspect.signature(plan_fn).parameters)
    settings = set(params[params.index("space") + 1:]) - set(CALIBRATION_ONLY)
    assert given == settings
    assert given <= set(inspect.signature(allocation_curve).parameters)
    assert given <= set(inspect.signature(in_dtype).parameters)
