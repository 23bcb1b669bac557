"""Plan the quickstart's model on N CPU ranks and choose what to measure.

The plan ranks every valid layout of a small search space (TP, PP, micro-batch, ZeRO 0/1) by
the cost model's predicted throughput. The layouts measured are the fastest predicted of each
TP x PP shape, best first: the top of the plan differs only in micro-batch and ZeRO stage,
which on a 4-layer model would measure the same run four times, while one layout per shape
shows whether the model ranks the shapes as they measure. A scaling series adds the fastest
data-parallel layout at fewer ranks (weak scaling: the global batch per rank stays the same),
so the scaling report has a curve to draw.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from frontier_llm.catalog import load_model, load_system
from frontier_llm.planner import Plan, SearchSpace, plan
from frontier_llm.quickstart.settings import Settings
from frontier_llm.specs.axes import MODEL_AXES
from frontier_llm.specs.layout import Layout, zero_preset


@dataclass(frozen=True)
class Choice:
    """What the plan said and what will be measured."""

    plan: Plan
    ranked: pd.DataFrame  # every valid layout that fits, fastest predicted first
    chosen: pd.DataFrame  # the rows of ``ranked`` measured at full size (one per shape)
    layouts: tuple[Layout, ...]  # ``chosen`` as layouts
    scaling: tuple[Layout, ...]  # the scaling series' smaller points (may be empty)


def search_space(settings: Settings) -> SearchSpace:
    """TP and PP over the divisors of the ranks, micro-batch 1-2, ZeRO 0-1, fp32 (CPU ranks)."""
    divisors = tuple(d for d in range(1, settings.ranks + 1) if settings.ranks % d == 0)
    return SearchSpace(tp=divisors, pp=divisors, micro_batch=(1, 2), schedule=("1f1b",),
                       recompute=("none",), sequence_parallel=(False,),
                       sharding=(zero_preset(0), zero_preset(1)), dtype="fp32")


def choose(settings: Settings, system_name: str | None = None) -> Choice:
    """Plan with ``system_name`` (the quickstart's calibrated file), else the settings' system."""
    model, system = load_model(settings.model), load_system(system_name or settings.system)
    result = plan(model, system, settings.ranks, settings.global_batch, search_space(settings))
    ranked = result.ranked()
    indices = result.ranked_indices()
    # A shape: the degrees of one model replica (tp x pp, and cp where the plan has it).
    first_of_shape = ~ranked.duplicated(subset=[str(a) for a in MODEL_AXES if a in ranked])
    picked = [i for i, keep in zip(indices, first_of_shape, strict=True) if keep]
    picked = picked[:settings.layouts]
    chosen = ranked[first_of_shape].head(settings.layouts).reset_index(drop=True)
    layouts = tuple(result.layout(i) for i in picked)
    return Choice(result, ranked, chosen, layouts, scaling_series(layouts))


def scaling_series(layouts: tuple[Layout, ...]) -> tuple[Layout, ...]:
    """The fastest chosen layout with data parallelism, at every smaller data-parallel degree
    that divides it (halving), with the global batch per rank kept: a weak-scaling series."""
    base = next((lay for lay in layouts if lay.dp > 1), None)
    if base is None:
        return ()
    out = []
    dp = base.dp // 2
    while dp >= 1 and base.dp % dp == 0:
        d = base.to_dict()
        d.pop("zero_stage", None)
        d.update(dp=dp, global_batch=base.global_batch * dp // base.dp)
        out.append(Layout.from_dict(d))
        if dp == 1:
            break
        dp //= 2
    return tuple(sorted(out, key=lambda lay: lay.world_size))
