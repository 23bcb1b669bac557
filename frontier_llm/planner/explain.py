"""Say why the planner's winner wins: what each alternative choice would cost, and what the
rules rejected."""

from __future__ import annotations

import numpy as np

from frontier_llm.costmodel import TIME_PARTS
from frontier_llm.planner.plan import Plan
from frontier_llm.planner.space import ENGINE_REASON, OOM
from frontier_llm.specs.engine_rules import RULES
from frontier_llm.specs.forms import LAYOUT_COLUMNS, label

# Knobs compared one at a time (the fastest layout that differs from the winner in this knob):
# every layout column the plan varies, but dp, which follows from tp and pp on a GPU count.
NOT_COMPARED = ("dp", "global_batch")
PART_NAMES = {
    "compute": "matrix compute", "elementwise": "element-wise work",
    "recompute": "recomputation", "tp_comm": "TP communication",
    "cp_comm": "CP K/V exchange", "ep_comm": "EP all-to-all", "pp_comm": "PP communication",
    "pp_bubble": "pipeline bubble", "head": "output layer", "dp_comm": "exposed DP communication",
    "optimizer": "optimizer step",
}


def _layout_text(plan: Plan, i: int) -> str:
    return label(plan.layout(i))


def _main_difference(plan: Plan, best: int, other: int) -> str:
    """The breakdown term that grows most from the winner to ``other``."""
    deltas = {k: plan.figures[f"time_{k}_s"][other] - plan.figures[f"time_{k}_s"][best]
              for k in TIME_PARTS}
    part = max(deltas, key=deltas.get)
    return f"+{deltas[part]:.3g} s of {PART_NAMES[part]}"


def _engine_rejections(plan: Plan) -> dict[str, tuple[int, list[str]]]:
    """Per engine, the layouts its own rules rejected and the rules that did."""
    out: dict[str, tuple[int, list[str]]] = {}
    for (engine, rule), code in ENGINE_REASON.items():
        count = int(np.sum(plan.reason == code))
        if count:
            total, rules = out.get(str(engine), (0, []))
            out[str(engine)] = (total + count, [*rules, RULES[engine].reason(rule)
                                                .removeprefix(f"engine {engine} ")])
    return out


def _compared_knobs(plan: Plan) -> list[str]:
    """The layout columns the plan varies (more than one value planned), but NOT_COMPARED."""
    layouts = plan.layouts
    return [k for k in LAYOUT_COLUMNS if k not in NOT_COMPARED and hasattr(layouts, k)
            and len(np.unique(getattr(layouts, k))) > 1]


def _slower(ratio: float) -> str:
    """``1.12x the step time``; within 1 %, the percentage (1.00x hid which was slower)."""
    if ratio < 1.01:
        return f"+{(ratio - 1) * 100:.1f} % step time"
    return f"{ratio:.2f}x the step time"


def explain(plan: Plan) -> str:
    lines = []
    total = len(plan.reason)
    valid = int(plan.valid.sum())
    lines.append(f"Evaluated {total:,} layouts: {valid:,} valid and fit in "
                 f"{plan.system.memory_bytes / 1e9:.0f} GB, {total - valid:,} rejected:")
    for reason, count in sorted(plan.rejections().items(), key=lambda kv: -kv[1]):
        lines.append(f"  {count:>10,}  {reason}")
    by_engine = _engine_rejections(plan)
    if by_engine:
        lines.append("Rejected by an engine's own rules (specs/engine_rules.py):")
        lines += [f"  {engine:<10} {count:>10,}  ({'; '.join(rules)})"
                  for engine, (count, rules) in by_engine.items()]
    order = plan.order()
    if not len(order):
        lines.append("No layout is valid and fits.")
        return "\n".join(lines)
    best = int(order[0])
    f = plan.figures
    step = f["step_time_s"][best]
    lines.append("")
    lines.append(f"Winner: {_layout_text(plan, best)}")
    lines.append(f"  {step:.4g} s per step, {f['tokens_per_s'][best]:,.0f} tokens/s, MFU "
                 f"{f['mfu'][best]:.1%}, peak memory {f['peak_memory_bytes'][best] / 1e9:.1f} GB")
    parts = sorted(((f[f"time_{k}_s"][best], k) for k in TIME_PARTS), reverse=True)
    lines.append("  time: " + ", ".join(f"{PART_NAMES[k]} {v / step:.0%}" for v, k in parts
                                        if v / step >= 0.005))
    lines.append("Why: the fastest layout with a different choice of each knob")
    # Knobs whose fastest alternative is the same layout (changing tp also changes pp and the
    # interleaving) share one row: the table once printed that layout for each of them.
    rows: dict[int | None, list[str]] = {}
    for knob in _compared_knobs(plan):
        col = getattr(plan.layouts, knob)
        other = order[col[order] != col[best]]
        rows.setdefault(int(other[0]) if len(other) else None, []).append(knob)
    for j, names in rows.items():
        knobs = ", ".join(names)
        if j is None:
            lines.append(f"  {knobs:<18} no valid alternative fits")
            continue
        slower = f["step_time_s"][j] / step
        lines.append(f"  {knobs:<18} {_layout_text(plan, j)}: {_slower(slower)} "
                     f"({_main_difference(plan, best, j)})")
    faster_oom = np.flatnonzero((plan.reason == OOM)
                                & (f["tokens_per_s"] > f["tokens_per_s"][best]))
    if len(faster_oom):
        lines.append(f"  {len(faster_oom):,} layouts would be faster but do not fit in memory")
    return "\n".join(lines)
