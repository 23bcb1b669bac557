"""The Mixture-of-Experts part of a trace: all-to-all time and expert load, per step and rank.

Each rank keeps one :func:`step_record` per step (its MoE blocks' dispatch and combine seconds,
forward plus the backward of each exchange, the assignments each expert computed from this
rank's tokens, those capacity dropped, and the aux loss); rank 0 merges them into the trace's
optional ``moe`` object (:func:`merge`, bench/trace_schema.json) and the summary's
``moe_dispatch_s`` / ``moe_combine_s`` / ``expert_imbalance`` (:func:`summary_fields`).

Load imbalance is the busiest expert's assignments over the mean expert's in a block (1.0 is
perfectly even; the step time of an expert-parallel layer follows the busiest expert's rank):
the max/mean ratio Megatron-Core's router logs as its load imbalance and GShard §2.2 bounds
with the capacity factor.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any


def step_record(stats: Mapping[str, Any]) -> dict:
    """One rank's step from its blocks' ``MoEStats`` (bench/moe.py ``take_stats``)."""
    return {
        "dispatch_s": sum(s.dispatch_s for s in stats.values()),
        "combine_s": sum(s.combine_s for s in stats.values()),
        "tokens": {block: list(s.tokens) for block, s in stats.items()},
        "dropped": sum(s.dropped for s in stats.values()),
        "aux_loss": sum(s.aux_loss for s in stats.values()),
    }


def imbalance(tokens: Sequence[int]) -> float | None:
    """Busiest expert's assignments over the mean expert's (None when none were routed)."""
    mean = sum(tokens) / len(tokens) if tokens else 0
    return max(tokens) / mean if mean else None


def merge(per_rank: Sequence[Sequence[dict]], steps: Sequence[dict], replicas: int,
          token_ranks: Sequence[bool] | None = None) -> dict | None:
    """The trace's ``moe`` object from every rank's step records (``per_rank[r][i]``: rank r,
    step i) and the merged ``steps`` (their warm-up flags); ``replicas``: the ranks holding
    the same blocks (dp x cp), over which the aux loss is a mean; ``token_ranks``: which ranks'
    tokens and aux losses count (the tp ranks of a group route the same tokens: one of them;
    default every rank). None for a dense model."""
    if not any(per_rank):
        return None
    counted = [r for r, ok in zip(per_rank, token_ranks or [True] * len(per_rank),
                                  strict=True) if ok]
    count = min(len(r) for r in per_rank)
    measured = [i for i in range(count) if not steps[i]["warmup"]] or list(range(count))
    tokens: dict[str, list[int]] = {}
    dropped = 0
    for records in counted:
        for i in measured:
            dropped += records[i]["dropped"]
            for block, counts in records[i]["tokens"].items():
                have = tokens.setdefault(block, [0] * len(counts))
                tokens[block] = [a + b for a, b in zip(have, counts, strict=True)]
    blocks = sorted(tokens, key=int)
    ratios = [imbalance(tokens[b]) for b in blocks]
    out_steps = [{"step": steps[i]["step"], "warmup": steps[i]["warmup"],
                  "dispatch_s": [r[i]["dispatch_s"] for r in per_rank],
                  "combine_s": [r[i]["combine_s"] for r in per_rank],
                  "aux_loss": sum(r[i]["aux_loss"] for r in counted) / replicas}
                 for i in range(count)]
    slowest = {k: [max(out_steps[i][k]) for i in measured] for k in ("dispatch_s", "combine_s")}
    known = [x for x in ratios if x is not None]
    return {
        "blocks": [int(b) for b in blocks],
        "tokens_per_expert": [tokens[b] for b in blocks],
        "imbalance": ratios,
        "imbalance_max": max(known) if known else None,
        "dropped": dropped,
        "dispatch_s": statistics.median(slowest["dispatch_s"]),
        "combine_s": statistics.median(slowest["combine_s"]),
        "steps": out_steps,
    }


def summary_fields(moe: Mapping[str, Any] | None) -> dict:
    """The summary's MoE figures (the slowest rank's median dispatch and combine seconds per
    step, the worst block's imbalance); empty for a dense run."""
    if not moe:
        return {}
    return {"moe_dispatch_s": moe["dispatch_s"], "moe_combine_s": moe["combine_s"],
            "expert_imbalance": moe["imbalance_max"]}
