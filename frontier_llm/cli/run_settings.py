"""The run settings flm plan's flags give the cost model, built in one place: every path of
flm plan (the ranking, --system A,B, --min-gpus, the curve, --fp8-speedup) prices the same
run. Each path once picked its own keywords, and --min-gpus dropped the overlap flags while
--system A,B dropped the MoE ones; a setting added here reaches all of them."""

from __future__ import annotations

import argparse

from frontier_llm.cli.moe_args import moe_run_from_args
from frontier_llm.cli.overlap_args import p2p_overlap_from_args, tp_overlap_from_args

# planner.plan's keywords that are a calibration row's, not a flag of flm plan (the row's
# stated reduction dtype, gradient sync and FP8 parameters; planner/calibration.py).
CALIBRATION_ONLY = ("reduce_fp32", "grad_sync", "fp8_params")


def run_settings(args: argparse.Namespace) -> dict[str, object]:
    """planner.plan's run-setting keywords from flm plan's flags (each flag's default where
    a command lacks it): ``eager``, ``overlap_comm``, ``tp_comm_overlap``, ``p2p_overlap``,
    ``moe_run`` and ``cp_exchange``; planner.allocation.allocation_curve takes the same."""
    return {
        "eager": bool(getattr(args, "eager", False)),
        "overlap_comm": getattr(args, "deepspeed_overlap_comm", "on") == "on",
        "tp_comm_overlap": tp_overlap_from_args(args),
        "p2p_overlap": p2p_overlap_from_args(args),
        "moe_run": moe_run_from_args(args),
        "cp_exchange": getattr(args, "cp_exchange", None),
    }
