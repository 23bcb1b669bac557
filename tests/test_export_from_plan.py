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
