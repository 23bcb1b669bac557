"""flm bench under any binding: device choice, transport, suspect runs, collective timeout.

The device and transport functions are pure functions of the environment, so they are tested
here for GPU bindings this machine does not have (no GPU here). The store and CLI are real; the
gloo run's record is checked in test_bench_cli.py.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from store_fixtures import make_trace

from frontier_llm.bench import placement
from frontier_llm.bench.run import _judge_transport


@pytest.mark.parametrize("local_rank", range(8))
def test_one_visible_device_is_device_0_for_every_local_rank(local_rank):
    """--gpu-bind=closest (Frontier): each rank sees one GCD, relabelled 0."""
    assert placement.device_index(local_rank, 1) == 0


@pytest.mark.parametrize("local_rank", range(8))
def test_all_visible_devices_give_each_rank_its_own(local_rank):
    """CPU masks with every GCD visible (LUMI), or plain --gpus-per-node (DGX)."""
    assert placement.device_index(local_rank, 8) == local_rank
    assert placement.device_index(local_rank + 8, 8) == local_rank  # never out of range


def test_no_visible_device_is_an_error():
    with pytest.raises(RuntimeError, match="sees no GPU"):
        placement.device_index(0, 0)


@pytest.mark.parametrize("env,local_rank,expected", [
    ({"ROCR_VISIBLE_DEVICES": "5"}, 5, 0),  # Frontier --gpu-bind=closest: one GCD, relabelled 0
    ({"CUDA_VISIBLE_DEVICES": "3"}, 3, 0),
    ({"ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, 5, 5),  # LUMI CPU masks: every GCD visible
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, 7, 7),  # DGX --gpus-per-node
    ({"ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "HIP_VISIBLE_DEVICES": "2"}, 6, 0),
])
def test_deepspeed_local_rank_is_the_chosen_device(monkeypatch, env, local_rank, expected):
    """DeepSpeed calls set_device(LOCAL_RANK): the engine must export the device run.py chose.

    No GPU here: the visibility variables stand for what srun sets, the device count for what
    the runtime reports, and a stub ``deepspeed`` module records LOCAL_RANK when the engine
    hands over to it (the real DeepSpeed path runs on CPUs in test_bench_deepspeed.py).
    """
    import sys
    import types

    import torch

    from frontier_llm.bench.deepspeed_engine import DeepSpeedEngine

    index = placement.device_index(local_rank, placement.visible_count(env))
    assert index == expected
    seen = {}

    class Handover(Exception):
        pass

    def init_distributed(**_):
        seen["LOCAL_RANK"] = os.environ["LOCAL_RANK"]
        raise Handover

    monkeypatch.setenv("LOCAL_RANK", str(local_rank))  # what torchrun would have set
    monkeypatch.setattr(torch.distributed, "get_backend", lambda *a: "nccl")
    monkeypatch.setitem(sys.modules, "deepspeed",
                        types.SimpleNamespace(init_distributed=init_distributed))
    with pytest.raises(Handover):
        DeepSpeedEngine(None, None, rank=local_rank, world_size=8,
                        device=torch.device("cuda", index), local_rank=local_rank)
    assert seen["LOCAL_RANK"] == str(expected)


def test_visible_count_reads_every_variable():
    assert placement.visible_count({}) is None
    assert placement.visible_count({"CUDA_VISIBLE_DEVICES": "0,1"}) == 2
    assert placement.visible_count({"CUDA_VISIBLE_DEVICES": ""}) == 0


@pytest.mark.parametrize("log,expected", [
    ("x NCCL INFO NET/OFI Using aws-ofi-rccl 1.4.0\n", "OFI"),
    ("x NCCL INFO NET/Socket : Using [0]hsn0:10.1.1.1<0>\n", "Socket"),
    ("NCCL INFO NET/Socket : Using [0]hsn0\nNCCL INFO NET/OFI Using aws-ofi-rccl\n", "OFI"),
    ("NCCL INFO Using network Socket\n", "Socket"),
    ("NCCL INFO NET/IB : Using [0]mlx5_0:1/IB\nNCCL INFO Using network IB\n", "IB"),
    ("NCCL INFO Using network AWS Libfabric\n", "OFI"),
    ("nothing about the network\n", None),
])
def test_transport_from_the_debug_log(log, expected):
    assert placement.transport_from_log(log) == expected


def test_transport_falls_back_to_nccl_net_then_unknown_and_gloo_is_gloo():
    assert placement.transport("gloo", {"NCCL_NET": "OFI"}) == "gloo"
    assert placement.transport("nccl", {"NCCL_NET": "OFI"}) == "OFI"
    assert placement.transport("nccl", {"NCCL_NET": "AWS Libfabric"}) == "OFI"
    assert placement.transport("nccl", {}) == "unknown"
    assert placement.transport("nccl", {"NCCL_NET": "OFI"}, "Using network Socket") == "Socket"


def test_collective_timeout_grows_by_doublings_not_with_ranks():
    """Issue 39: 30 s + 0.1 s per rank gave 7,556 s at 9,408 Frontier nodes (75,264 ranks),
    longer than a 2-hour job; a fixed time per doubling keeps it at minutes."""
    assert placement.collective_timeout_s(8, {}) == pytest.approx(30.0)
    assert placement.collective_timeout_s(2, {}) == pytest.approx(30.0)
    assert placement.collective_timeout_s(3072, {}) == pytest.approx(30 + 30 * math.log2(384))
    full = placement.collective_timeout_s(9408 * 8, {})
    assert full == pytest.approx(30 + 30 * math.log2(9408)) and full < 0.1 * 7200
    # doubling the job adds the same 30 s whatever its size: not linear in the ranks
    assert placement.collective_timeout_s(2 * 75264, {}) - full == pytest.approx(30.0)
    assert placement.collective_timeout_s(10**9, {}) == 600.0  # PyTorch's NCCL default
    assert placement.collective_timeout_s(3072, {"FLM_COLLECTIVE_TIMEOUT": "12"}) == 12.0


def test_multi_node_socket_run_is_suspect(tmp_path):
    log = tmp_path / "nccl.log"
    log.write_text("NCCL INFO Bootstrap : Using hsn0\nNCCL INFO Using network Socket\n")
    trace = {"status": "completed", "error": None, "environment": {}}
    _judge_transport(trace, "nccl", log, nodes=2)
    assert trace["status"] == "suspect" and "TCP sockets" in trace["error"]
    assert trace["environment"]["transport"] == "Socket"
    one = {"status": "completed", "error": None, "environment": {}}
    _judge_transport(one, "nccl", log, nodes=1)  # one node: sockets are expected
    assert one["status"] == "completed"
    ofi = {"status": "completed", "error": None, "environment": {}}
    log.write_text("NCCL INFO NET/OFI Using aws-ofi-rccl 1.4.0\n")
    _judge_transport(ofi, "nccl", log, nodes=2)
    assert ofi["status"] == "completed" and ofi["environment"]["transport"] == "OFI"


@pytest.mark.slow
def test_a_suspect_run_is_stored_and_shown_by_flm_results(tmp_path):
    """The real store (SQLite) and CLI: the suspect trace is kept, flagged, not validated."""
    trace = make_trace("sus", dp=2)
    trace["status"] = "suspect"
    trace["error"] = "collectives of this 2-node run went over TCP sockets"
    trace["environment"].update(transport="Socket", nodes=2, binding="closest")
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "sus.trace.json").write_text(json.dumps(trace))
    db = f"sqlite:///{tmp_path / 'flm.db'}"
    cli = [sys.executable, "-m", "frontier_llm.cli"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([*cli, "collect", str(tmp_path / "traces"), "--db", db, "--quiet"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([*cli, "results", "--db", db, "--format", "json"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    [row] = json.loads(out.stdout)
    assert row["status"] == "suspect" and "TCP sockets" in row["error"]
    out = subprocess.run([*cli, "results", "--db", db], capture_output=True, text=True,
                         env=env, timeout=120)
    assert "suspect" in out.stdout


def test_a_suspect_trace_is_a_completed_job_with_its_reason():
    from frontier_llm.jobs.classify import classify
    from frontier_llm.jobs.lifecycle import JobState
    from frontier_llm.jobs.slurm import JobStatus

    verdict = classify(JobStatus("1", "COMPLETED", exit_code="0:0").observation(),
                       trace={"status": "suspect", "error": "over TCP sockets"})
    assert (verdict.state, verdict.reason) == (JobState.COMPLETED, "over TCP sockets")
