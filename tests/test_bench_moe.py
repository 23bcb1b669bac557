"""Mixture-of-Experts in ``flm bench``'s native engine (issue 41): the MoE block and expert
parallelism over real gloo ranks.

The block (bench/moe.py) is checked on its own first: routing, capacity, the Switch aux loss and
its gradient, parameter counts equal to the model spec's. Then real runs: ``flm bench`` spawns
its ranks (the local launcher, gloo, all-to-all dispatch and combine) and its losses must equal
the single-process reference (fp32, 1e-5 relative), and a two- or four-rank worker compares
every gradient (dense and every expert's, after the engine's reductions) with the reference's.
Nothing is mocked: CPU ranks run what a GPU run runs, over gloo instead of NCCL.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from frontier_llm.bench.engine import reference_losses
from frontier_llm.bench.mesh import check_layout, expert_groups, mesh_dims
from frontier_llm.bench.model import build_model, loss_fn
from frontier_llm.bench.moe import (
    EPContext,
    MoE,
    apply_ep,
    capacity,
    ep_experts,
    moe_modules,
    route,
    set_aux_scale,
    switch_aux_loss,
    take_stats,
)
from frontier_llm.bench.trace import read_trace, validate_trace
from frontier_llm.bench.trace_moe import imbalance, merge, step_record
from frontier_llm.catalog import load_model
from frontier_llm.errors import UserError
from frontier_llm.specs import axes
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.parallel import ParallelConfig
from tests.test_bench_cli import bench
from tests.test_bench_cp import run_workers

STEPS = 4

# A tiny MoE (Llama style, 4 experts, top-2) and a variant with every optional part: a dense
# first block, a shared expert, dropping at capacity factor 1 and GeLU experts with biases.
TINY_MOE = dict(name="tiny-moe", layers=2, hidden=64, heads=4, kv_heads=2, seq_len=32,
                vocab=256, ffn_hidden=128, activation="swiglu", norm="rmsnorm",
                position="rope", bias=False, num_experts=4, top_k=2, router_aux_loss=0.01)
FULL_MOE = dict(name="tiny-moe-full", layers=3, hidden=64, heads=4, kv_heads=4, seq_len=32,
                vocab=256, ffn_hidden=128, activation="gelu", norm="layernorm",
                position="learned", bias=True, num_experts=4, top_k=2, expert_ffn_hidden=64,
                shared_experts=1, dense_layers=1, capacity_factor=1.0, router_aux_loss=0.02)


def model_file(tmp_path: Path, fields: dict) -> Path:
    path = tmp_path / f"{fields['name']}.yaml"
    path.write_text(yaml.safe_dump(fields))
    return path


def spec(fields: dict) -> ModelSpec:
    return ModelSpec(**fields)


# -- the block on its own -----------------------------------------------------------------------
def test_route_keeps_top_k_renormalised_and_sorted_by_expert():
    probs = torch.tensor([[0.5, 0.3, 0.1, 0.1], [0.1, 0.2, 0.3, 0.4], [0.4, 0.1, 0.4, 0.1]])
    expert, token, weight, counts = route(probs, 2, None)
    assert expert.tolist() == sorted(expert.tolist())
    assert counts.tolist() == [2, 1, 2, 1]
    pairs = {(int(t), int(e)): float(w) for e, t, w in zip(expert, token, weight, strict=True)}
    assert pairs[(0, 0)] == pytest.approx(0.5 / 0.8) and pairs[(0, 1)] == pytest.approx(0.3 / 0.8)
    assert pairs[(1, 3)] == pytest.approx(0.4 / 0.7) and pairs[(1, 2)] == pytest.approx(0.3 / 0.7)
    for t in range(3):  # each token's weights sum to one
        assert sum(w for (tt, _), w in pairs.items() if tt == t) == pytest.approx(1.0)


def test_capacity_drops_second_choices_before_first_and_later_tokens_first():
    """Every token picks expert 0 first: at capacity 2 the first two tokens' first choices are
    kept at expert 0, the third token's is dropped; second choices are each alone."""
    probs = torch.tensor([[0.7, 0.2, 0.1, 0.0], [0.6, 0.1, 0.3, 0.0], [0.5, 0.0, 0.1, 0.4]])
    expert, token, _, counts = route(probs, 2, 2)
    kept = sorted(zip(expert.tolist(), token.tolist(), strict=True))
    assert kept == [(0, 0), (0, 1), (1, 0), (2, 1), (3, 2)]
    assert counts.tolist() == [3, 1, 1, 1]  # the router's choice, before the drop
    s = spec(FULL_MOE)
    # Megatron-Core's get_capacity: ceil(factor x tokens x top_k / experts).
    assert capacity(s, 10) == 5 and capacity(spec(TINY_MOE), 10) is None


def test_switch_aux_loss_is_one_for_an_even_router_and_grows_with_imbalance():
    even = torch.full((8, 4), 0.25)
    assert float(switch_aux_loss(even, torch.tensor([4, 4, 4, 4]), 2)) == pytest.approx(1.0)
    skewed = torch.tensor([[0.7, 0.1, 0.1, 0.1]] * 8)
    assert float(switch_aux_loss(skewed, torch.tensor([8, 8, 0, 0]), 2)) == pytest.approx(
        4 * (0.5 * 0.7 + 0.5 * 0.1))


@pytest.mark.parametrize("fields", [TINY_MOE, FULL_MOE], ids=["tiny-moe", "full"])
def test_block_parameters_are_the_model_specs(fields):
    """Every parameter the benchmark builds is one ModelSpec counts (total), MoE blocks where
    moe_block says, and an ep rank holds its 1/ep of the routed experts."""
    s = spec(fields)
    model = build_model(s, seed=0)
    assert sum(p.numel() for p in model.parameters()) == s.num_params()
    blocks = [i for i in range(s.layers) if isinstance(model.layers[str(i)].feed_forward, MoE)]
    assert blocks == [i for i in range(s.layers) if s.moe_block(i)]
    for i in blocks:
        assert sum(p.numel() for p in model.layers[str(i)].parameters()) == s.layer_params(i)

    # Ep rank 1 of 2 builds experts 2 and 3 only, with the whole model's weights.
    part = build_model(s, seed=0, experts=ep_experts(s.num_experts, 2, 1))
    whole = dict(model.named_parameters())
    for _, moe in moe_modules(part):
        assert moe.local_experts == [2, 3]
        routed = sum(p.numel() for n, p in moe.named_parameters() if n.startswith("experts."))
        assert routed == s.expert_params() // 2
    for name, p in part.named_parameters():
        assert torch.equal(p, whole[name]), name
    with pytest.raises(ValueError, match="not ep rank 0's"):
        apply_ep(part, EPContext(None, 2, 0))


def _router_grads(s: ModelSpec, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
    model = build_model(s, seed=3)
    model.train()
    seen: dict = {}
    # The last block: a later block's aux loss would reach an earlier router through the
    # residual stream too.
    block = model.layers[str(s.layers - 1)].feed_forward
    # A pre-hook that returns None leaves the input as it was.
    block.register_forward_pre_hook(lambda m, args: seen.update(x=args[0].detach()) or None)
    loss_fn(model(x), x).backward()
    return block.router.weight.grad.clone(), block.router.weight.detach().clone(), seen


def test_aux_loss_gradient_is_added_to_the_routers():
    """The router's gradient with the aux loss minus without it is the gradient of
    coeff x Switch's loss by hand (the top-k choice held fixed), for the last block's input."""
    with_aux = spec(TINY_MOE)
    without = spec({**TINY_MOE, "router_aux_loss": 0.0})
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    g_aux, weight, seen = _router_grads(with_aux, x)
    g_none, _, _ = _router_grads(without, x)
    w = weight.clone().requires_grad_(True)
    tokens = seen["x"].reshape(-1, 64)
    probs = (tokens @ w.t()).softmax(-1)
    counts = torch.bincount(probs.topk(2, dim=-1).indices.flatten(), minlength=4)
    (0.01 * switch_aux_loss(probs, counts, 2)).backward()
    torch.testing.assert_close(g_aux - g_none, w.grad, rtol=1e-4, atol=1e-7)
    assert w.grad.abs().sum() > 0


def test_stats_count_every_assignment_once_and_reset():
    s = spec(TINY_MOE)
    model = build_model(s, seed=0)
    model.train()
    set_aux_scale(model, 0.5)
    x = torch.randint(0, 256, (2, 32))
    loss_fn(model(x), x).backward()
    stats = take_stats([model])
    assert sorted(stats) == ["0", "1"]
    assert all(sum(st.tokens) == 2 * 32 * s.top_k and st.dropped == 0 for st in stats.values())
    assert all(st.aux_loss > 0 for st in stats.values())
    record = step_record(stats)
    assert record["dispatch_s"] == 0.0  # no exchange without ep
    assert all(sum(st.tokens) == 0 for st in take_stats([model]).values())


def test_merge_sums_ranks_over_measured_steps_and_names_the_busiest_expert():
    def rec(t0, t1, d):
        return {"dispatch_s": d, "combine_s": d / 2, "tokens": {"1": [t0, t1]}, "dropped": 0,
                "aux_loss": 0.02}

    steps = [{"step": 0, "warmup": True}, {"step": 1, "warmup": False},
             {"step": 2, "warmup": False}]
    per_rank = [[rec(100, 0, 9.0), rec(3, 1, 0.1), rec(3, 1, 0.3)],
                [rec(0, 100, 9.0), rec(3, 1, 0.2), rec(3, 1, 0.2)]]
    moe = merge(per_rank, steps, replicas=2)
    assert moe["tokens_per_expert"] == [[12, 4]]  # the warm-up step left out
    assert moe["imbalance"] == [1.5] and moe["imbalance_max"] == 1.5
    # The tp ranks of a group route the same tokens: only one of them counts.
    tp_pair = merge(per_rank, steps, replicas=1, token_ranks=[True, False])
    assert tp_pair["tokens_per_expert"] == [[6, 2]] and tp_pair["steps"][1]["aux_loss"] == 0.02
    assert tp_pair["steps"][1]["dispatch_s"] == [0.1, 0.2]  # every rank's time
    assert moe["dispatch_s"] == pytest.approx(0.25)  # median of the slowest rank's 0.2, 0.3
    assert moe["steps"][1]["dispatch_s"] == [0.1, 0.2]
    assert moe["steps"][1]["aux_loss"] == pytest.approx(0.02)
    assert imbalance([0, 0]) is None
    assert merge([[], []], steps, 2) is None


# -- groups and refusals (no process group) -----------------------------------------------------
def test_expert_groups_follow_the_ep_coordinate():
    """dp 4, ep 2: ep groups are runs of two consecutive dp ranks, expert-dp the ranks at the
    same place of each run; with pp 2 each stage has its own groups."""
    lay = ParallelConfig(dp=4, ep=2, global_batch=4, dtype="fp32")
    assert expert_groups(lay) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    # The engine's mesh gives each rank the same ep index (its memory record's ep_rank).
    dims = mesh_dims(lay)
    assert [dims.coords(r)["ep"] for r in range(4)] == [0, 1, 0, 1]
    assert all(dims.coords(r)["ep"] == axes.coords(r, lay)["ep"] for r in range(4))
    lay = ParallelConfig(dp=2, pp=2, ep=2, global_batch=4, dtype="fp32")
    groups, edp = expert_groups(lay)
    assert groups == [[0, 1], [2, 3]] and edp == [[0], [1], [2], [3]]
    for group in groups:
        assert [axes.coords(r, lay)["ep"] for r in group] == [0, 1]
    assert axes.expert_data_parallel(lay) == 1


@pytest.mark.parametrize("model, fields, words", [
    (FULL_MOE, dict(cp=2, global_batch=2), "drops tokens at capacity over whole sequences"),
    (TINY_MOE, dict(dp=4, ep=4, global_batch=4, sharding=dict(
        params="partial:2", grads="partial:2", optim="partial:2")), "ep divides the shard"),
])
def test_what_the_native_engine_does_not_run_is_refused(model, fields, words):
    with pytest.raises(UserError, match=words):
        check_layout(spec(model), ParallelConfig(dtype="fp32", **fields))


@pytest.mark.parametrize("fields", [
    dict(tp=2, sequence_parallel=True, global_batch=1),
    dict(recompute="full", global_batch=1),
    dict(recompute="selective-op", global_batch=1),
    dict(dp=2, ep=2, global_batch=2, sharding=1),
    dict(dp=2, ep=2, global_batch=2, sharding=2),
    dict(dp=2, ep=2, global_batch=2, sharding=3),
    dict(cp=2, ep=2, global_batch=1),
    dict(dp=4, ep=2, global_batch=4, sharding=dict(params="partial:2", grads="partial:2",
                                                   optim="partial:2")),
])
def test_what_the_planner_proposes_for_moe_is_accepted(fields):
    """What tests/test_bench_moe_layouts.py runs against one process is not refused."""
    check_layout(spec(TINY_MOE), ParallelConfig(dtype="fp32", **fields))


def test_the_deepspeed_engine_refuses_an_moe_model():
    from frontier_llm.bench.engines import check

    with pytest.raises(UserError, match="MoE on engine native only"):
        check(spec(TINY_MOE), ParallelConfig(dtype="fp32", engine="deepspeed"))
    check(load_model("tiny-llama"), ParallelConfig(dtype="fp32", engine="deepspeed"))


def test_ep_alone_runs_on_the_fewest_data_parallel_ranks_it_divides(tmp_path):
    """`flm bench --model tiny-moe --ep 2` means two ranks (dp 2); a given --dp is kept (and
    refused if ep does not divide it); with cp, dp is what ep still needs."""
    from frontier_llm.bench.config import build_config
    from frontier_llm.cli import build_parser

    path = str(model_file(tmp_path, TINY_MOE))

    def layout(*argv: str):
        args = build_parser().parse_args(["bench", "--model", path, "--system", "cpu-local",
                                          "--trace-dir", str(tmp_path), *argv])
        return build_config(args).layout

    got = layout("--ep", "2")
    assert (got.dp, got.ep, got.global_batch, got.world_size) == (2, 2, 2, 2)
    assert layout("--ep", "2", "--dp", "4").dp == 4
    assert layout("--ep", "4", "--cp", "2").dp == 2
    assert layout().dp == 1
    with pytest.raises(Exception, match=r"ep \(2\) does not divide dp \(3\)"):
        layout("--ep", "2", "--dp", "3")


def test_bad_ep_is_refused_in_one_line_before_any_rank(tmp_path):
    path = model_file(tmp_path, TINY_MOE)
    out = tmp_path / "traces"
    proc, _ = bench(out, "--model", str(path), "--dp", "2", "--ep", "3", "--global-batch", "2")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "ep (3) does not divide dp (2)" in proc.stderr
    assert not out.exists() or not any(out.iterdir())
    proc, _ = bench(out, "--model", "tiny-llama", "--dp", "2", "--ep", "2",
                    "--global-batch", "2")
    assert proc.returncode == 2 and "needs a Mixture-of-Experts model" in proc.stderr


# -- real ranks: flm bench against the single-process reference ---------------------------------
def run_moe_bench(tmp_path: Path, model: Path, layout: ParallelConfig,
                  warmup: int = 0) -> tuple[subprocess.CompletedProcess, dict]:
    s = layout.sharding
    flags = ["--tp", str(layout.tp), "--dp", str(layout.dp), "--pp", str(layout.pp),
             "--cp", str(layout.cp),
             "--ep", str(layout.ep), "--sharding", f"p={s.params},g={s.grads},o={s.optim}",
             "--global-batch", str(layout.global_batch), "--micro-batch",
             str(layout.micro_batch), "--dtype", "fp32", "--steps", str(STEPS),
             "--warmup", str(warmup)]
    if layout.pp > 1:
        flags += ["--schedule", layout.schedule]
    if layout.sequence_parallel:
        flags += ["--sequence-parallel"]
    flags += ["--recompute", str(layout.recompute)]
    proc, _ = bench(tmp_path, "--model", str(model), *flags, timeout=300)
    path = tmp_path / "run.trace.json"
    assert path.exists(), proc.stderr[-3000:]
    return proc, read_trace(path)  # validated against the schema


def assert_reference_losses(model: Path, layout: ParallelConfig, trace: dict) -> None:
    assert trace["status"] == "completed", trace["error"]
    got = [s["loss"] for s in trace["steps"]]
    want = reference_losses(load_model(str(model)), layout, len(got))
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert abs(g - w) <= 1e-5 * abs(w), (step, got, want)


@pytest.mark.slow
def test_flm_bench_ep2_trains_like_one_process_and_traces_the_all_to_alls(tmp_path):
    """`flm bench --model tiny-moe --ep 2`: two gloo ranks (dp 2), each with two of the four
    experts, train exactly like one process; the trace and the printed line carry the dispatch
    and combine seconds and the experts' load."""
    model = model_file(tmp_path, TINY_MOE)
    layout = ParallelConfig(dp=2, ep=2, global_batch=2, dtype="fp32")
    proc, _ = bench(tmp_path / "t", "--model", str(model), "--ep", "2", "--dtype", "fp32",
                    "--steps", str(STEPS), "--warmup", "1", timeout=300)
    trace = read_trace(tmp_path / "t" / "run.trace.json")  # validated against the schema
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_reference_losses(model, layout, trace)
    moe = trace["moe"]
    assert moe["blocks"] == [0, 1] and moe["dropped"] == 0
    # Every assignment of the measured steps is counted once: tokens x top_k per block.
    tokens = STEPS * layout.global_batch * 32 * 2
    assert [sum(t) for t in moe["tokens_per_expert"]] == [tokens, tokens]
    assert moe["imbalance_max"] >= 1.0
    assert all(len(s["dispatch_s"]) == 2 and min(s["dispatch_s"]) > 0 for s in moe["steps"])
    assert moe["dispatch_s"] > 0 and moe["combine_s"] > 0
    assert [m["ep_rank"] for m in trace["memory"]] == [0, 1]
    # Each rank holds half the routed experts: the dense parameters plus two of four experts.
    s = load_model(str(model))
    dense = s.num_params() - s.layers * s.expert_params()
    assert trace["memory"][0]["params_bytes"] == 4 * (dense + s.layers * s.expert_params() // 2)
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["moe_dispatch_s"] == moe["dispatch_s"]
    assert line["expert_imbalance"] == moe["imbalance_max"]


@pytest.mark.slow
@pytest.mark.parametrize("fields, lay", [
    (TINY_MOE, dict(dp=4, ep=2, global_batch=4)),  # expert-dp 2: experts reduced over it
    (FULL_MOE, dict(dp=2, ep=2, global_batch=4, micro_batch=1)),  # dropping, shared, dense
    (TINY_MOE, dict(dp=2, pp=2, ep=2, global_batch=4, schedule="1f1b")),
    (FULL_MOE, dict(tp=2, dp=2, ep=2, global_batch=4)),  # expert-tp = tp
    (TINY_MOE, dict(dp=2, global_batch=4, sharding=3)),  # ep 1: experts under FSDP2
    # The planner's (flm plan --model tiny-moe --system cpu-local --gpus 4 --engine native):
    # experts sharded over expert-dp, recomputed blocks counting their tokens once.
    (TINY_MOE, dict(dp=4, ep=2, global_batch=4, sharding=2, recompute="selective-op")),
    (TINY_MOE, dict(tp=2, dp=2, ep=2, global_batch=4, sharding=3, sequence_parallel=True,
                    recompute="full")),
    (TINY_MOE, dict(dp=2, cp=2, ep=2, global_batch=4, sharding=2)),
], ids=["dp4-ep2", "full-ep2", "pp2-dp2-ep2", "full-tp2-dp2-ep2", "dp2-fsdp-ep1",
        "dp4-ep2-zero2-selop", "tp2-dp2-ep2-sp-zero3-full", "cp2-dp2-ep2-zero2"])
def test_more_expert_parallel_layouts_train_like_one_process(tmp_path, fields, lay):
    model = model_file(tmp_path, fields)
    layout = ParallelConfig(dtype="fp32", **lay)
    proc, trace = run_moe_bench(tmp_path / "t", model, layout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_reference_losses(model, layout, trace)
    moe = trace["moe"]
    s = load_model(str(model))
    # Every assignment counted once (not once per tp rank): tokens x top_k per block, computed
    # or dropped at capacity.
    per_block = STEPS * layout.global_batch * s.seq_len * s.top_k
    computed = [sum(t) for t in moe["tokens_per_expert"]]
    assert sum(computed) + moe["dropped"] == per_block * len(computed)
    if fields is TINY_MOE:
        assert computed == [per_block] * 2 and moe["dropped"] == 0
    else:
        assert moe["dropped"] > 0 and moe["blocks"] == [1, 2]


def test_a_dense_trace_has_no_moe_fields_and_old_traces_stay_valid(tmp_path):
    """The moe object and summary fields are optional: a trace without them (every trace
    before MoE) validates; a malformed one does not."""
    from frontier_llm.bench.record import trace_record

    class Cfg:
        model = load_model("tiny-gpt")
        system = __import__("frontier_llm.catalog", fromlist=["load_system"]).load_system(
            "cpu-local")
        layout = ParallelConfig(dtype="fp32")

    trace = trace_record(Cfg(), run_id="r", status="completed", started_at="t",
                         environment={"hostnames": [], "world_size": 1, "backend": "gloo",
                                      "device": "cpu", "versions": {}}, labels={})
    validate_trace(trace)
    assert "moe" not in trace
    trace["moe"] = {"blocks": [0]}
    with pytest.raises(Exception, match="moe"):
        validate_trace(trace)


# -- real ranks: every gradient against the reference's -----------------------------------------
# One rank of the engine: one forward and backward of global batch 0 with the engine's gradient
# reductions, every parameter's gradient (named, this rank's) saved by rank 0 for the test.
_WORKER = textwrap.dedent('''
    import os, sys, traceback
    import torch, torch.distributed as dist
    from frontier_llm.bench.engine import NativeEngine
    from frontier_llm.catalog import load_model
    from frontier_llm.specs.parallel import ParallelConfig

    rank, world, port, model, tp, dp, ep, out = sys.argv[1:9]
    rank, world = int(rank), int(world)
    code = 1
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
        layout = ParallelConfig(tp=int(tp), dp=int(dp), ep=int(ep), global_batch=int(dp),
                                dtype="fp32")
        engine = NativeEngine(load_model(model), layout, rank=rank, world_size=world,
                              device=torch.device("cpu"))
        engine.gradients(0)
        # A tensor-parallel shard's gradient is gathered whole over its tp group (the same
        # parameters, in the same order, on every rank of it).
        mine = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach()
                for n, p in engine.modules[0].named_parameters()}
        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
        if rank == 0:
            torch.save(everyone, out)
        dist.barrier()
        dist.destroy_process_group()
        code = 0
    except BaseException:
        traceback.print_exc()  # os._exit below would drop it
    finally:
        # gloo's threads can abort a normal interpreter exit (machine-notes): leave by os._exit.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
''')


def rank_gradients(tmp_path: Path, model: Path, tp: int, dp: int, ep: int) -> list[dict]:
    """Run tp x dp worker ranks and return every rank's named gradients."""
    script, out = tmp_path / "moe_worker.py", tmp_path / "grads.pt"
    script.write_text(_WORKER)
    world = int(axes.world_size({"tp": tp, "dp": dp}))
    run_workers(script, world, str(model), str(tp), str(dp), str(ep), str(out))
    return torch.load(out)


def reference_gradients(s: ModelSpec, global_batch: int) -> dict[str, torch.Tensor]:
    """One process, global batch 0 in micro-batches of one sequence, as the ranks take it."""
    from frontier_llm.bench.data import TokenSource

    model = build_model(s, seed=0)
    model.train()
    set_aux_scale(model, 1.0 / global_batch)
    inputs, targets = TokenSource(s.vocab, s.seq_len, 0).rank_batch(0, global_batch, 1, 0)
    for x, y in zip(inputs.split(1), targets.split(1), strict=True):
        (loss_fn(model(x), y) / global_batch).backward()
    return {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("fields, tp, dp, ep", [(TINY_MOE, 1, 2, 2), (FULL_MOE, 1, 2, 2),
                                                (TINY_MOE, 1, 4, 2), (FULL_MOE, 2, 2, 2)],
                         ids=["tiny-moe-dp2-ep2", "full-dp2-ep2", "tiny-moe-dp4-ep2",
                              "full-tp2-dp2-ep2"])
def test_every_gradient_equals_the_single_process_one(tmp_path, fields, tp, dp, ep):
    """After the engine's reductions (dense over dp, routed experts over expert-dp after the
    all-to-alls' backward) each rank's dense gradients and every expert's gradient, on the rank
    that holds it, equal the single-process run's within fp32 tolerance."""
    s = spec(fields)
    ranks = rank_gradients(tmp_path, model_file(tmp_path, fields), tp, dp, ep)
    layout = ParallelConfig(tp=tp, dp=dp, ep=ep, global_batch=dp)
    want = reference_gradients(s, dp)
    experts_seen = set()
    for rank, grads in enumerate(ranks):
        ep_rank = axes.coords(rank, layout)["ep"]
        for name, g in grads.items():
            torch.testing.assert_close(g, want[name], rtol=1e-4, atol=1e-6, msg=name)
            if ".experts." in name:
                experts_seen.add(name)
                index = int(name.split(".experts.")[1].split(".")[0])
                assert index // (s.num_experts // ep) == ep_rank, (rank, name)
        dense = {n for n in want if ".experts." not in n}
        assert dense <= set(grads), dense - set(grads)
    # Every expert's every gradient was compared, on the rank that holds it.
    assert experts_seen == {n for n in want if ".experts." in n}
