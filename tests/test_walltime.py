"""Predicted runtime against the time limit, before sbatch: refused in one line naming the
layout, the figures and what to change; ``--allow-overtime`` submits anyway."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from frontier_llm.catalog import load_system
from frontier_llm.jobs.walltime import (
    MARGIN,
    Need,
    OvertimeError,
    check,
    longest_time,
    startup_s,
    steps_in,
)
from frontier_llm.specs.site import time_seconds

SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"
FRONTIER = load_system("frontier").site


def test_need_is_start_up_plus_steps_plus_margin():
    need = Need(646.0, 13, nodes=16)
    assert need.startup_s == 66.0  # OLCF's 51 s at 8 nodes, plus 15 s for one doubling
    assert need.seconds == pytest.approx((66.0 + 13 * 646.0) * (1 + MARGIN))
    assert Need(646.0, need.steps_within(need.seconds), 16).seconds <= need.seconds
    assert Need(646.0, need.steps_within(7200) + 1, 16).seconds > 7200
    assert Need(0.003, 13).seconds < 300  # a tiny CPU job fits five minutes


@pytest.mark.parametrize(
    "nodes,step,limit,partition,refused,hint",
    [
        # The figures: 175B at 16 nodes, 13 steps of 646 s against one hour.
        (16, 646.0, "01:00:00", "batch", True, "(4 fit, warm-up included), more nodes, or pass"),
        (16, 646.0, "02:00:00", "batch", True, "more nodes, or pass --allow-overtime"),  # bin: 2 h
        (
            32,
            328.0,
            "01:00:00",
            "batch",
            True,
            "a longer --time (at least 1:23:17; the site allows 02:00:00)",
        ),
        (32, 328.0, "02:00:00", "batch", False, ""),
        (16, 646.0, "04:00:00", "extended", False, ""),  # extended: 24 h, the bins do not apply
        (96, 907.0, "02:00:00", "batch", True, "the site allows 06:00:00"),
        (1, None, "00:01:00", "batch", False, ""),  # no prediction: nothing to compare
    ],
)
def test_runtime_against_time_limit(nodes, step, limit, partition, refused, hint):
    jobs = [("k", nodes, step, limit, 13)]
    if not refused:
        check(jobs, FRONTIER, partition=partition)
        return
    with pytest.raises(OvertimeError) as err:
        check(jobs, FRONTIER, partition=partition)
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"walltime: layout k ({nodes} nodes) needs ")
    assert f"13 steps x {step:.0f} s predicted" in text and f"--time {limit}" in text
    assert hint in text, text
    assert check(jobs, FRONTIER, partition=partition, allow_overtime=True)


def test_start_up_is_sublinear_cited_and_lowered_by_staging():
    """Issue 39: a second per node refused a 9,408-node job that computes for 5.5 minutes at
    2 hours ("needs 3:07:50 ... 0 steps fit"). The start-up is anchored on OLCF's 8-node
    figures and grows by a fixed time per doubling."""
    assert startup_s(8) == 51.0 and startup_s(8, staged=True) == 46.0  # OLCF sbcast guide
    assert startup_s(1) == 51.0  # never below the measured 8-node figure
    full = startup_s(9408)
    assert full == pytest.approx(51.0 + 15.0 * math.log2(9408 / 8))  # 204 s
    assert startup_s(2 * 9408) - full == pytest.approx(15.0)  # a doubling adds 15 s
    assert startup_s(9408, staged=True) < full / 2  # staged: 97 s
    # 5.5 minutes of steps (10 x 33 s) on the whole machine in a 2-hour job: not refused
    jobs = [("full", 9408, 33.0, "02:00:00", 10)]
    ((_, need),) = check(jobs, FRONTIER, partition="batch")
    assert need < 0.1 * 7200
    # the old allowance (60 s + 1 s a node) needed 3:07:50 for the same job
    assert (60 + 9408 + 330) * (1 + MARGIN) > 3 * 3600


def test_staging_the_environment_lets_a_job_fit_that_would_not():
    jobs = [("k", 9408, 1.0, "00:03:20", 1)]  # 200 s
    assert check(jobs, FRONTIER, partition="batch", staged=True)  # (97 + 1) x 1.15 = 113 s
    with pytest.raises(OvertimeError, match=r"start-up 204 s"):
        check(jobs, FRONTIER, partition="batch")  # (204 + 1) x 1.15 = 236 s


def test_a_packed_sweeps_refusal_says_time_is_per_layout():
    with pytest.raises(OvertimeError) as err:
        check([("k", 16, 646.0, "01:00:00", 13)], FRONTIER, partition="batch", pack=4)
    assert "(per layout: a pack of 4 asks for 4 x this)" in str(err.value)


def test_a_layouts_own_steps_count():
    argv = ("--model", "m", "--steps", "10", "--warmup", "3", "--steps", "2")
    assert steps_in(argv, 99) == 5  # the last --steps wins, as argparse reads it
    assert steps_in(("--model", "m"), 13) == 13


def test_longest_time_per_partition_and_qos():
    assert longest_time(FRONTIER, 16, "batch", None) == "02:00:00"
    assert longest_time(FRONTIER, 16, "extended", None) == "24:00:00"
    assert longest_time(FRONTIER, 200, "batch", "debug") == "02:00:00"


def test_too_short_walltime_is_refused_by_the_cli_and_allow_overtime_renders(tmp_path):
    env = {**os.environ, "FLM_ACCOUNT": "ABC123"}
    cmd = [
        sys.executable,
        "-m",
        "frontier_llm.cli",
        "sweep",
        "render",
        str(SWEEPS / "frontier-1t-strong.yaml"),
        "--out",
        str(tmp_path / "o"),
        "--time",
        "01:00:00",
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and "walltime: layout gpt-1t-n96-" in out.stderr
    assert not (tmp_path / "o").exists()
    out = subprocess.run(
        [*cmd, "--allow-overtime"], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    jobs = json.loads((tmp_path / "o" / "manifest.json").read_text())["jobs"]
    assert all(j["predicted_runtime_s"] > time_seconds(j["time"]) for j in jobs[:1])
