"""The planner's MoE layouts in ``flm bench``'s native engine (issue 53): sequence parallelism,
selective-op and full recompute of MoE blocks, cp, and ZeRO-1 / FSDP2 / HSDP sharding with
ep > 1 (dense parameters over dp x cp, routed experts over expert-dp), each on real gloo ranks
against one process.

A worker rank runs one training step of the engine: forward and backward of global batch 0
with every reduction, then the optimizer step. Rank 0 gathers every rank's gradients (before the
step) and parameters (after it), each whole (tensor- and FSDP-shards gathered), and the test
compares them with one process doing the same: the gradients, on the rank that holds each, and
so the Adam update of every parameter, dense and each expert's. Recompute is also checked to
count each block's routed tokens and aux loss once, as the run without recompute does.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from frontier_llm.bench.data import TokenSource
from frontier_llm.bench.engine import LR
from frontier_llm.bench.model import build_model, loss_fn
from frontier_llm.bench.moe import set_aux_scale, take_stats
from frontier_llm.bench.optim import LocalAdam
from frontier_llm.specs import axes
from frontier_llm.specs.parallel import ParallelConfig
from tests.test_bench_cp import run_workers
from tests.test_bench_moe import FULL_MOE, TINY_MOE, model_file, spec

_WORKER = textwrap.dedent('''
    import json, sys
    import torch, torch.distributed as dist
    from frontier_llm.bench.engine import NativeEngine
    from frontier_llm.catalog import load_model
    from frontier_llm.specs.parallel import ParallelConfig
    from rank_exit import run_rank  # tests/, put on sys.path by run_ranks

    def whole(t):
        # A tensor-parallel or FSDP2 shard gathered whole over its mesh.
        return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()

    def main(rank, world, port, model, layout, out):
        rank, world = int(rank), int(world)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
        engine = NativeEngine(load_model(model), ParallelConfig(**json.loads(layout)),
                              rank=rank, world_size=world, device=torch.device("cpu"))
        engine.gradients(0)
        named = list(engine.modules[0].named_parameters())
        grads = {n: whole(p.grad) for n, p in named if p.grad is not None}
        engine.optimizer.step()
        params = {n: whole(p) for n, p in named}
        moe = [(step["tokens"], step["dropped"], step["aux_loss"]) for step in engine.moe_steps]
        everyone = [None] * world
        dist.all_gather_object(everyone, {"grads": grads, "params": params, "moe": moe})
        if rank == 0:
            torch.save(everyone, out)
        dist.barrier()
        dist.destroy_process_group()
        return 0

    run_rank(main, *sys.argv[1:7])
''')


def run_ranks(tmp_path: Path, fields: dict, layout: dict) -> list[dict]:
    """Every rank's gradients, updated parameters and MoE record after one engine step."""
    script, out = tmp_path / "worker.py", tmp_path / "ranks.pt"
    script.write_text(f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                      + _WORKER)
    world = int(axes.world_size(ParallelConfig(dtype="fp32", **layout)))
    run_workers(script, world, str(model_file(tmp_path, fields)),
                json.dumps({"dtype": "fp32", **layout}), str(out), timeout=180)
    return torch.load(out)


def reference_step(fields: dict, global_batch: int, micro_batch: int, recompute: str = "none"
                   ) -> tuple[dict, dict, dict]:
    """One process, no parallelism: (gradients, parameters after one Adam step, MoE stats)."""
    s = spec(fields)
    model = build_model(s, seed=0, recompute=recompute)
    model.train()
    chunks = global_batch // micro_batch
    set_aux_scale(model, 1.0 / chunks)
    inputs, targets = TokenSource(s.vocab, s.seq_len, 0).rank_batch(0, global_batch, 1, 0)
    for x, y in zip(inputs.split(micro_batch), targets.split(micro_batch), strict=True):
        (loss_fn(model(x), y) / chunks).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    stats = take_stats([model])
    LocalAdam(list(model.parameters()), lr=LR).step()
    return grads, {n: p.detach() for n, p in model.named_parameters()}, stats


def assert_like_one_process(fields: dict, layout: dict, ranks: list[dict]) -> None:
    """Each rank's gradients and updated parameters (experts: the ones it holds) equal the
    single-process step's; every expert is held by some rank."""
    lay = ParallelConfig(dtype="fp32", **layout)
    grads, params, stats = reference_step(fields, lay.global_batch, lay.micro_batch)
    seen = set()
    for rank, got in enumerate(ranks):
        for name, g in got["grads"].items():
            torch.testing.assert_close(g, grads[name], rtol=1e-4, atol=1e-6,
                                       msg=lambda m, n=name, r=rank: f"rank {r} grad {n}: {m}")
        for name, p in got["params"].items():
            # Adam's first step moves each element by about LR x sign(gradient): where the
            # gradient is within rounding of zero the sign is noise, so there only the bound
            # holds; everywhere else the update must match closely.
            sure = grads[name].abs() > 1e-6
            assert (p - params[name]).abs().max() <= 2.01 * LR, (rank, name)
            torch.testing.assert_close(p[sure], params[name][sure], rtol=1e-4, atol=1e-6,
                                       msg=lambda m, n=name, r=rank: f"rank {r} param {n}: {m}")
        assert {n for n in params if ".experts." not in n} <= set(got["params"])
        seen |= set(got["params"])
    assert seen == set(params)
    # Each block's assignments per expert, summed over the ranks of one tp index (a tp group
    # routes the same tokens), are the single process's exactly; the aux loss is the mean of
    # the dp ranks' (each the mean over its micro-batches). A recompute counts neither again.
    routers = [got["moe"][0] for r, got in enumerate(ranks) if axes.coords(r, lay)["tp"] == 0]
    for block, st in stats.items():
        assert [sum(c) for c in zip(*(t[block] for t, _, _ in routers), strict=True)] \
            == st.tokens, block
    assert sum(d for _, d, _ in routers) == sum(st.dropped for st in stats.values())
    aux = sum(st.aux_loss for st in stats.values())
    assert sum(a for _, _, a in routers) / len(routers) == pytest.approx(aux, rel=1e-5)


@pytest.mark.parametrize("fields", [TINY_MOE, FULL_MOE], ids=["tiny-moe", "full"])
@pytest.mark.parametrize("recompute", ["full", "selective-op"])
def test_a_recomputed_moe_block_counts_its_routing_once(fields, recompute):
    """Full (reentrant: forward without autograd, graph rebuilt in backward) and selective-op
    (non-reentrant) recompute of MoE blocks: the same gradients as no recompute (the aux loss's
    included, started once) and the same tokens per expert, drops and aux loss (not twice)."""
    grads, _, stats = reference_step(fields, 4, 2)
    got, _, got_stats = reference_step(fields, 4, 2, recompute=recompute)
    for name, g in grads.items():
        torch.testing.assert_close(got[name], g, rtol=1e-5, atol=1e-7, msg=name)
    assert {k: (v.tokens, v.dropped) for k, v in got_stats.items()} == \
        {k: (v.tokens, v.dropped) for k, v in stats.items()}
    for block, st in stats.items():
        assert st.aux_loss > 0 and got_stats[block].aux_loss == pytest.approx(st.aux_loss)


@pytest.mark.slow
@pytest.mark.parametrize("fields, layout", [
    (TINY_MOE, dict(tp=2, dp=2, ep=2, global_batch=2, sequence_parallel=True)),
    # expert-dp 1: the experts stay out of FSDP2, the dense parameters shard over dp x tp.
    (FULL_MOE, dict(tp=2, dp=2, ep=2, global_batch=4, sequence_parallel=True, sharding=3,
                    recompute="full")),
    (TINY_MOE, dict(dp=4, ep=2, global_batch=4, sharding=1)),
    (TINY_MOE, dict(dp=4, ep=2, global_batch=4, sharding=2, recompute="selective-op")),
    (FULL_MOE, dict(dp=4, ep=2, global_batch=4, sharding=3, recompute="full")),
    # Tensor-parallel experts sharded by FSDP2 over expert-dp 2: one world mesh for both.
    (TINY_MOE, dict(tp=2, dp=4, ep=2, global_batch=4, sharding=2)),
    # Context parallelism: the aux loss's counts summed over cp; experts FSDP2-sharded over
    # expert-dp cut from dp x cp.
    (TINY_MOE, dict(dp=2, cp=2, ep=2, global_batch=2)),
    (TINY_MOE, dict(dp=2, cp=2, ep=2, global_batch=4, micro_batch=1, sharding=3,
                    recompute="full")),
    # HSDP: experts replicated over dp_replicate, sharded over dp_shard / ep (here 1, then 2).
    (TINY_MOE, dict(dp=4, ep=2, global_batch=4, sharding=dict(
        params="partial:2", grads="partial:2", optim="partial:2"))),
    (TINY_MOE, dict(dp=8, ep=2, global_batch=8, sharding=dict(
        params="partial:4", grads="partial:4", optim="partial:4"))),
], ids=["sp-tp2-dp2-ep2", "full-sp-zero3-fullrc-tp2-dp2-ep2", "zero1-dp4-ep2",
        "zero2-selop-dp4-ep2", "full-zero3-fullrc-dp4-ep2", "zero2-tp2-dp4-ep2",
        "cp2-dp2-ep2", "cp2-dp2-ep2-zero3-fullrc", "hsdp2-dp4-ep2", "hsdp4-dp8-ep2"])
def test_planner_moe_layouts_train_like_one_process(tmp_path, fields, layout):
    """Gradients after the engine's reductions and parameters after its (sharded) Adam step
    equal one process's, every expert's on the rank that holds it."""
    assert_like_one_process(fields, layout, run_ranks(tmp_path, fields, layout))


@pytest.mark.parametrize("layout", [
    dict(dp=4, ep=2, global_batch=4, sharding=2, recompute="selective-op"),
    dict(tp=2, dp=4, ep=2, global_batch=4, sharding=3, sequence_parallel=True),
], ids=["zero2-selop-dp4-ep2", "zero3-sp-tp2-dp4-ep2"])
def test_flm_memcheck_measures_the_sharded_expert_layouts(layout):
    """flm memcheck builds the same engine in fake mode: the expert-dp mesh cut from the world
    mesh is built there too, and the rank holds half the routed experts' parameters, sharded
    over expert-dp 2 (the dense ones over dp 4)."""
    from frontier_llm.bench.memcheck import measure

    s = spec(TINY_MOE)
    lay = ParallelConfig(dtype="fp32", **layout)
    got = measure(s, lay)
    dense = s.num_params() - s.layers * s.expert_params()
    experts = s.layers * s.expert_params() // 2  # this ep rank's half
    # fp32: 4 bytes a parameter, each split over tp, dense over dp 4, experts over expert-dp 2.
    want = 4 * (dense / 4 + experts / 2) / lay.tp
    assert got.backward["params"] == pytest.approx(want, rel=0.05), got.backward
