"""The run settings flm plan's flags give the cost model: every path of flm plan (the ranking,
--system A,B, --min-gpus, the curve, --fp8-speedup) prices the same run. Each path once picked
its own keywords, and --min-gpus dropped the overlap flags while --system A,B dropped the MoE
ones. The flags are read here into planner/run_settings.py's RunSettings, which maps them to
the planner's keywords for the command line and the Python API alike."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from frontier_llm.cli.moe_args import moe_run_from_args
from frontier_llm.cli.overlap_args import p2p_overlap_from_args, tp_overlap_from_args
from frontier_llm.planner.run_settings import CALIBRATION_ONLY, RunSettings

# How each setting is read from flm plan's flags (each flag's default where a command lacks
# it); one entry per field of RunSettings (tests/test_cli_plan.py holds them equal).
READERS: dict[str, Callable[[argparse.Namespace], object]] = {
    "eager": lambda a: bool(getattr(a, "eager", False)),
    "deepspeed_overlap_comm": lambda a: getattr(a, "deepspeed_overlap_comm", "on") == "on",
    "tp_comm_overlap": tp_overlap_from_args,
    "p2p_overlap": p2p_overlap_from_args,
    "moe_overlap": lambda a: moe_run_from_args(a).overlap,
    "moe_dispatcher": lambda a: moe_run_from_args(a).dispatcher,
    "cp_exchange": lambda a: getattr(a, "cp_exchange", None),
}


def settings_from_args(args: argparse.Namespace) -> RunSettings:
    """The run flm plan's flags describe."""
    return RunSettings(**{name: read(args) for name, read in READERS.items()})


def run_settings(args: argparse.Namespace) -> dict[str, object]:
    """planner.plan's run-setting keywords from flm plan's flags (RunSettings.keywords);
    planner.allocation.allocation_curve takes the same."""
    return settings_from_args(args).keywords()


__all__ = ["CALIBRATION_ONLY", "READERS", "run_settings", "settings_from_args"]
