"""Context parallelism in the planner and the CLI (issue 30): at a long sequence the open cp
list finds layouts that fit where cp 1 has none; the open list's rule; --seq-len."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.planner import REASONS, SearchSpace, plan
from frontier_llm.planner.space import MIN_CP_TOKENS, OOM, open_cp


@pytest.fixture(scope="module")
def long_175b():
    return dataclasses.replace(load_model("gpt-175b"), seq_len=131072)


# The batch this test was written for: 1,024 sequences, the old default (one per GCD); today's
# default is 4M tokens, 32 sequences (planner.plan.default_global_batch).
BATCH = 1024


def test_cp_fits_175b_at_128k_on_1024_frontier_gcds_where_cp1_does_not(long_175b):
    system = load_system("frontier")
    # Without cp, nothing fits with tensor parallelism inside a node (tp <= 8): at most a
    # tight layout (its memory interval straddles the GCD; kept, ranked after any that fits)...
    node = plan(long_175b, system, 1024, BATCH, SearchSpace(cp=(1,), tp=(1, 2, 4, 8)))
    assert not np.any(node.valid & ~node.figures["memory_tight"])
    assert np.any(node.reason == OOM)
    # ... and only tp 16 across two nodes with full recompute does, at half the speed.
    without = plan(long_175b, system, 1024, BATCH, SearchSpace(cp=(1,)))
    worst = without.layout(int(without.ranked_indices(1)[0]))
    assert worst.tp == 16 and worst.recompute == "full"
    open_ = plan(long_175b, system, 1024, BATCH, SearchSpace())
    best = open_.layout(int(open_.ranked_indices(1)[0]))
    assert best.cp > 1 and best.tp <= 8 and best.world_size == 1024
    step = open_.figures["step_time_s"]
    assert step[open_.ranked_indices(1)[0]] < 0.6 * without.figures["step_time_s"][
        without.ranked_indices(1)[0]]
    assert {2, 4, 8} <= set(np.unique(open_.layouts.cp[open_.valid]).tolist())


def test_open_cp_list():
    m = load_model("gpt-175b")
    assert m.seq_len <= MIN_CP_TOKENS and open_cp(m, 1024) == (1,)  # short context: cp 1 only
    long = dataclasses.replace(m, seq_len=131072)
    assert open_cp(long, 128) == (1, 2, 4, 8, 16, 32)  # 131072 / 32 = 4096 a rank
    assert open_cp(long, 12) == (1, 2, 4)  # divisors of what tp leaves
    assert open_cp(dataclasses.replace(m, seq_len=3 * 8192), 64) == (1, 2, 4)


def test_cp_reason_is_layouts_first(long_175b):
    m = dataclasses.replace(long_175b, seq_len=12296)  # 12296 / (2 x 8) is not whole
    p = plan(m, load_system("frontier"), 64, 64, SearchSpace(cp=(8,), tp=(8,), pp=(1,)))
    assert set(REASONS[c] for c in np.unique(p.reason)) == {"seq_len not divisible by 2 x cp"}


def test_seq_len_flag(capsys):
    from frontier_llm.cli import main

    rc = main(["predict", "--model", "gpt-175b", "--system", "frontier", "--seq-len", "131072",
               "--tp", "8", "--cp", "8", "--pp", "16", "--micro-batch", "1",
               "--global-batch", "16", "--recompute", "selective-op", "--format", "json"])
    import json

    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["layout"]["cp"] == 8 and out["breakdown"]["time_s"]["cp_comm"] > 0
    rc = main(["plan", "--model", "gpt-175b", "--seq-len", "131072", "--gpus", "128",
               "--cp", "1", "--tp", "8", "--pp", "16", "--top", "1"])
    assert rc == 1  # nothing fits without cp
    assert "gpt-175b at 131,072 tokens on 128 x" in capsys.readouterr().err


def test_long_context_sweep_renders_cp_jobs(tmp_path):
    """sweeps/frontier-175b-long-context.yaml: the planner chooses cp at 32K and 128K tokens,
    the site's rules accept the scripts, and each job line carries its --cp."""
    from pathlib import Path

    from frontier_llm.jobs.sweepdir import render_sweep, with_resources
    from frontier_llm.jobs.sweepspec import load_sweep

    path = Path(__file__).resolve().parents[1] / "sweeps" / "frontier-175b-long-context.yaml"
    sweep = with_resources(load_sweep(path), account="ABC123")
    assert {j.model.seq_len for j in sweep.jobs} == {32768, 131072}
    assert all(j.layout.cp > 1 and j.layout.world_size == 1024 for j in sweep.jobs)
    manifest = render_sweep(sweep, tmp_path / "out")  # site rules and walltime checked
    text = "".join(manifest.path(g["script"]).read_text() for g in manifest.groups)
    for job in sweep.jobs:
        argv = list(job.bench_args)
        assert argv[argv.index("--cp") + 1] == str(job.layout.cp)
        [line] = [x for x in text.splitlines() if f"key={job.key};" in x]
        assert f" --cp {job.layout.cp} " in line
