"""flm export --from-plan says what it skips of flm plan's ranking and why, and flm plan flags a
#1 that no exported trainer runs (a plan's #1 was once skipped in silence)."""

from __future__ import annotations

from frontier_llm.cli import main


def test_from_plan_names_each_skipped_rank_and_its_reason(tmp_path, capsys):
    """llama3-70b on 64 Frontier GCDs, recompute selective or none: the plan's first ranks are
    layouts torchtitan cannot run (attention-core recompute, or ZeRO-1, which FSDP2 has not);
    torchtitan gets the first rank it runs, and stderr names every rank skipped before it with
    the trainer's reason."""
    import re

    out = tmp_path / "job.toml"
    assert main(["export", "--to", "torchtitan", "--model", "llama3-70b", "--system", "frontier",
                 "--from-plan", "--gpus", "64", "--plan-args=--recompute selective,none",
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "flm export: skipped plan rank 1 (" in err
    assert "torchtitan cannot run this layout" in err
    written = re.search(r"flm export: writing plan rank (\d+) \(", err)
    assert written, err
    skipped = re.findall(r"flm export: skipped plan rank (\d+) \(.*torchtitan cannot run", err)
    before = int(written.group(1)) - 1  # every rank above the one written was skipped
    assert before >= 1
    assert [int(r) for r in skipped] == list(range(1, min(before, 5) + 1)), err
    if before > 5:  # the first five by name, the rest counted
        assert f"flm export: ... and {before - 5} more skipped" in err
    assert "rank 1 among the layouts torchtitan" in err
    assert "data_parallel_shard_degree" in out.read_text()


def test_plan_flags_a_first_rank_no_trainer_runs(capsys):
    """Attention-core recompute with sharded states: Megatron-LM shards no parameters,
    torchtitan has no attention-core recompute, DeepSpeed no sequence parallelism; flm bench
    runs it."""
    base = ["plan", "--model", "llama3-70b", "--system", "frontier", "--gpus", "256", "--top", "2"]
    assert main([*base, "--recompute", "selective"]) == 0
    err = capsys.readouterr().err
    flagged = [line for line in err.splitlines() if line.startswith("# rank 1 (")]
    assert len(flagged) == 1 and "rc-selective" in flagged[0], err
    assert "runs under flm bench only" in flagged[0]
    assert main([*base, "--recompute", "full", "--sharding", "zero3"]) == 0
    assert "runs under flm bench only" not in capsys.readouterr().err


def test_from_plan_compiles_unless_the_plan_was_eager(tmp_path, capsys):
    """The plan's ranking priced fused kernels: torchtitan's TOML turns compilation on; a plan
    priced --eager (its --plan-args) is exported without it, ranked as eager."""
    import tomllib

    fused, eager = tmp_path / "f.toml", tmp_path / "e.toml"
    base = ["export", "--to", "torchtitan", "--model", "llama3-8b", "--from-plan", "--gpus", "8"]
    assert main([*base, "--out", str(fused)]) == 0
    assert main([*base, "--plan-args=--eager", "--out", str(eager)]) == 0
    assert tomllib.loads(fused.read_text())["compile"] == {"enable": True}
    assert "compile" not in tomllib.loads(eager.read_text())


def test_from_plan_refuses_a_setting_the_export_would_not_write(capsys):
    """A plan priced with DeepSpeed's overlap_comm off, another MoE dispatcher or an MoE
    overlap ranks a run the exported file is not (its ds_config sets overlap_comm, Megatron-LM
    gets --moe-token-dispatcher-type alltoall and no overlap): one line naming what the export
    writes, exit 2, nothing written. These were once dropped in silence."""
    cases = [
        ("deepspeed", "llama3-8b", "--deepspeed-overlap-comm off",
         "sets zero_optimization.overlap_comm true"),
        ("megatron-deepspeed", "llama3-8b", "--deepspeed-overlap-comm off",
         "sets zero_optimization.overlap_comm true"),
        ("megatron-lm", "tiny-moe", "--moe-dispatcher flex",
         "all-to-all token dispatch (--moe-dispatcher alltoall"),
        ("megatron-lm", "tiny-moe", "--moe-overlap ep-a2a",
         "without overlap (--moe-overlap none"),
        ("torchtitan", "tiny-moe", "--moe-overlap dualpipe",
         "without overlap (--moe-overlap none"),
    ]
    for trainer, model, flags, says in cases:
        capsys.readouterr()
        assert main(["export", "--to", trainer, "--model", model, "--from-plan", "--gpus", "8",
                     f"--plan-args={flags}"]) == 2, (trainer, flags)
        out = capsys.readouterr()
        assert out.out == ""
        lines = out.err.strip().splitlines()
        assert len(lines) == 1 and f"--plan-args '{flags}'" in lines[0], out.err
        assert says in lines[0], lines[0]


def test_from_plan_prices_and_writes_the_plans_router_balance(capsys):
    """--router-balance in --plan-args is the model's: Megatron-LM's command carries the
    aux-free router's expert bias (it was once neither priced nor written)."""
    base = ["export", "--to", "megatron-lm", "--model", "tiny-moe", "--from-plan", "--gpus", "8"]
    assert main(base) == 0
    assert "--moe-router-enable-expert-bias" not in capsys.readouterr().out
    assert main([*base, "--plan-args=--router-balance aux-free"]) == 0
    assert "--moe-router-enable-expert-bias" in capsys.readouterr().out.split()


def test_from_plan_accounts_for_every_run_setting_of_the_plan():
    """Each run setting flm plan prices (planner/run_settings.py) is written by the export or
    refused (cli/export.py SETTINGS_EXPORTED, unwritten_setting), so one added to the planner
    is not priced in the plan and dropped from the file in silence; the defaults pass."""
    from frontier_llm.catalog import load_model
    from frontier_llm.cli.export import SETTINGS_EXPORTED, unwritten_setting
    from frontier_llm.planner.run_settings import DEFAULTS, NAMES
    from frontier_llm.trainers import NAMES as TRAINERS
    from frontier_llm.trainers import get

    assert set(SETTINGS_EXPORTED) == set(NAMES)
    for name in TRAINERS:
        for model in ("tiny-moe", "llama3-8b"):
            assert unwritten_setting(get(name), load_model(model), DEFAULTS) is None
