"""The MoE run settings flm plan and flm predict share: how the expert-parallel all-to-alls are
dispatched and overlapped (costmodel/moe.py MoeRun) and how the router balances its experts
(the model's ``router_balance``, which the flag overrides)."""

from __future__ import annotations

import argparse
import dataclasses

from frontier_llm.costmodel.moe import MOE_DISPATCHERS, MOE_OVERLAPS, ROUTER_BALANCES, MoeRun
from frontier_llm.specs.model import ModelSpec

# The plan's line under --moe-overlap dualpipe: what its rows mean and what an export runs.
DUALPIPE_NOTE = (
    "# --moe-overlap dualpipe: DualPipe (DeepSeek's own schedule) replaces the pipeline "
    "schedule; its layouts are stated as Megatron-LM 1f1b with an even pp (the DeepSeek-V3 "
    "calibration row's form), the others rejected. No trainer flm exports to runs DualPipe: "
    "flm export writes these layouts under Megatron-LM's 1F1B, which the plan without "
    "--moe-overlap dualpipe prices")


def add_moe_args(p: argparse.ArgumentParser) -> None:
    """``--moe-overlap``, ``--moe-dispatcher``, ``--router-balance`` (read only for an MoE
    model)."""
    g = p.add_argument_group("Mixture-of-Experts run (docs/costmodel.md 'Mixture-of-Experts')")
    g.add_argument("--moe-overlap", choices=MOE_OVERLAPS, default="none",
                   help="how the expert-parallel all-to-alls overlap compute. none (default, "
                        "Megatron-LM's default and torchtitan's): every one exposed; ep-a2a: "
                        "Megatron-LM --overlap-moe-expert-parallel-comm --delay-wgrad-compute, "
                        "hidden behind the paired micro-batch's compute in the 1F1B steady "
                        "phase (Megatron-LM layouts only); dualpipe: DeepSeek-V3's DualPipe, "
                        "every micro-batch paired, one copy per node; it replaces the "
                        "pipeline schedule, so its layouts are Megatron-LM 1f1b with an even "
                        "pp of 2 or more (the planner rejects the others, flm predict "
                        "refuses them; no trainer flm exports to runs DualPipe)")
    g.add_argument("--moe-dispatcher", choices=MOE_DISPATCHERS, default="alltoall",
                   help="Megatron-LM --moe-token-dispatcher-type: alltoall (default) sends a "
                        "copy per routed expert; flex (DeepEP) sends a token once per "
                        "destination node and forwards it over NVLink, fewer network bytes, "
                        "fewest with node-limited routing (the model's topk_group)")
    g.add_argument("--router-balance", choices=ROUTER_BALANCES, default=None,
                   help="how the router balances the experts, which sets the slowest EP "
                        "rank's excess tokens (default: the model's, aux-loss unless its file "
                        "says otherwise): aux-loss (a balance loss on each micro-batch, "
                        "Megatron-LM's aux_loss: sampling noise only), aux-loss-global (the "
                        "loss on the global batch, Megatron-LM global_aux_loss, Qwen3: a "
                        "loss-balanced router's spread, x1.72 on the hottest of 64 experts), "
                        "aux-free (an expert bias, DeepSeek-V3, x1.04 on the hottest of 64), "
                        "forced (Megatron-LM --moe-router-force-load-balancing, benchmarks: "
                        "sampling noise only)")


def moe_run_from_args(args: argparse.Namespace) -> MoeRun:
    """The run settings the flags give (Megatron-LM's defaults where absent)."""
    return MoeRun(getattr(args, "moe_overlap", None) or "none",
                  getattr(args, "moe_dispatcher", None) or "alltoall")


def with_router_balance(model: ModelSpec, args: argparse.Namespace) -> ModelSpec:
    """``model`` with ``--router-balance`` applied to an MoE model (a dense one has no
    router)."""
    balance = getattr(args, "router_balance", None)
    if balance is None or not model.is_moe:
        return model
    return dataclasses.replace(model, router_balance=balance)


def moe_note(args: argparse.Namespace, model: ModelSpec) -> str:
    """The plan header's words for settings off their defaults."""
    if not model.is_moe:
        return ""
    run = moe_run_from_args(args)
    parts = [f"--moe-overlap {run.overlap}" if run.overlap != "none" else "",
             f"--moe-dispatcher {run.dispatcher}" if run.dispatcher != "alltoall" else "",
             f"router {model.router_balance}"]
    return ", MoE " + " ".join(p for p in parts if p)
