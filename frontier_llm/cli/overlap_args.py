"""``--overlap-p2p-comm`` and ``--tp-comm-overlap``: the run settings flm plan, flm predict,
flm report plan and flm export share for Megatron-Core's ``overlap_p2p_comm`` and Megatron-LM's
``--tp-comm-overlap`` (costmodel/p2p_overlap.py and costmodel/tp_overlap.py say where each
applies). One helper each, so every command reads and documents them alike."""

from __future__ import annotations

import argparse

from frontier_llm.costmodel.p2p_overlap import P2P_OVERLAP_FLAG
from frontier_llm.costmodel.tp_overlap import TP_OVERLAP_FLAG

P2P_OVERLAP_HELP = (
    "Megatron-LM's overlapped pipeline communication (Megatron-Core's overlap_p2p_comm: an "
    "interleaved schedule's sends/receives issued beside the neighbouring chunks' compute; "
    "engine megatron with --virtual-stages > 1 only). off (default): the command flm "
    "renders, --no-overlap-p2p-communication, every send exposed; on: Megatron-LM's own "
    "default at core_v0.15.3, as NeMo's MLPerf GPT-3 175B and Llama 3.1 405B configs run it "
    "(docs/costmodel.md section 5)")


def _add_switch(p: argparse.ArgumentParser, flag: str, help_text: str,
                default: str | None) -> None:
    p.add_argument(flag, choices=("on", "off"), default=default, help=help_text)


def _is_on(args: argparse.Namespace, dest: str) -> bool:
    # Off where the command has no such flag.
    return getattr(args, dest, "off") == "on"


def add_p2p_overlap(p: argparse.ArgumentParser, extra: str = "",
                    default: str | None = "off") -> None:
    """``--overlap-p2p-comm on|off`` (default off), styled as ``--tp-comm-overlap``;
    ``default`` None where the command must tell a given value from none (flm export)."""
    _add_switch(p, P2P_OVERLAP_FLAG, P2P_OVERLAP_HELP + extra, default)


def p2p_overlap_from_args(args: argparse.Namespace) -> bool:
    """Whether the flags ask for the overlap (off where the command has no such flag)."""
    return _is_on(args, "overlap_p2p_comm")


TP_OVERLAP_HELP = (
    "Megatron-LM's --tp-comm-overlap (TransformerEngine pipelines its TP "
    "all-gathers/reduce-scatters with the GEMMs; engine megatron with sequence parallelism "
    "only: Megatron-LM asserts it). off (default): the command flm renders, every TP "
    "collective exposed; on: a run that sets it, as the Megatron-LM README's H100 runs did "
    "(docs/costmodel.md section 5 and 'The corpus'); flm export --to megatron-lm then writes "
    "--tp-comm-overlap")


def add_tp_overlap(p: argparse.ArgumentParser, extra: str = "",
                   default: str | None = "off") -> None:
    """``--tp-comm-overlap on|off`` (default off); ``default`` None where the command must
    tell a given value from none (flm export)."""
    _add_switch(p, TP_OVERLAP_FLAG, TP_OVERLAP_HELP + extra, default)


def tp_overlap_from_args(args: argparse.Namespace) -> bool:
    """Whether the flags ask for TP overlap (off where the command has no such flag)."""
    return _is_on(args, "tp_comm_overlap")


__all__ = ["P2P_OVERLAP_HELP", "TP_OVERLAP_HELP", "add_p2p_overlap", "add_tp_overlap",
           "p2p_overlap_from_args", "tp_overlap_from_args"]
