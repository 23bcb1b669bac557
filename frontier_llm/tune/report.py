"""What ``flm tune status`` and ``flm tune best`` say about a stored study (no study file
needed: every trial carries its layout, prediction, measurement and links in user attributes)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from frontier_llm.errors import UserError
from frontier_llm.specs.forms import bench_command
from frontier_llm.specs.layout import Layout
from frontier_llm.tune import optuna_study as osx


def load(name: str, storage) -> optuna.Study:
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise UserError(f"no study named {name!r} in this database (flm tune run or step "
                        "creates it)") from None


def status(study: optuna.Study) -> dict[str, Any]:
    trials = study.get_trials(deepcopy=False)
    by_outcome = Counter(t.user_attrs.get(osx.A_OUTCOME, t.state.name.lower()) for t in trials)
    by_state = Counter(t.state.name for t in trials)
    jobs = [t for t in trials if osx.A_SWEEP in t.user_attrs]
    hours = sum(float(t.user_attrs.get("flm_node_hours") or 0.0) for t in trials)
    best = osx.best_trial(trials)
    out: dict[str, Any] = {
        "study": study.study_name,
        "trials": len(trials),
        "jobs": len(jobs),
        "budget": study.user_attrs.get("flm_budget"),
        "node_hours": round(hours, 6),
        "by_state": dict(by_state),
        "by_outcome": dict(by_outcome),
        "best": None,
    }
    if best is not None:
        out["best"] = winner(best)
    return out


def winner(t: FrozenTrial) -> dict[str, Any]:
    pred = t.user_attrs.get(osx.A_PREDICTION) or {}
    meas = t.user_attrs.get("flm_measured") or {}
    layout = dict(t.user_attrs.get(osx.A_LAYOUT) or {})
    out = {
        "trial": t.number,
        "throughput_per_gpu": t.values[0],
        "params": dict(t.params),
        "layout": layout,
        "measured": meas,
        "predicted": {k: pred.get(k) for k in ("throughput_per_gpu", "step_time_s",
                                               "peak_memory_bytes") if k in pred},
        "run_id": t.user_attrs.get("flm_run_id"),
        "run_row": t.user_attrs.get("flm_run_row"),
        "job_row": t.user_attrs.get("flm_job_row"),
        # A trial told from a sweep's run (Tuner.tell_sweep_runs) has that sweep, no job row.
        "sweep": t.user_attrs.get(osx.A_SWEEP) or t.user_attrs.get("flm_from_sweep"),
    }
    if pred.get("throughput_per_gpu") and meas.get("throughput_per_gpu"):
        out["predicted_over_measured"] = pred["throughput_per_gpu"] / meas["throughput_per_gpu"]
    return out


def status_lines(s: dict[str, Any]) -> list[str]:
    lines = [f"study {s['study']}: {s['trials']} trials, {s['jobs']} ran as jobs, "
             f"{s['node_hours']:.4g} node-hours"
             + (f" (budget {_budget(s['budget'])})" if s.get("budget") else "")]
    lines.append("  by outcome: " + ", ".join(f"{n} {k}" for k, n in
                                               sorted(s["by_outcome"].items())))
    lines.append("  by state: " + ", ".join(f"{n} {k}" for k, n in sorted(s["by_state"].items())))
    b = s["best"]
    if b is None:
        lines.append("  best: none measured yet")
        return lines
    lines.append(f"  best: trial {b['trial']}, {b['throughput_per_gpu']:,.1f} tokens/s per GPU: "
                 + ", ".join(f"{k}={v}" for k, v in b["params"].items()))
    p = b["predicted"]
    if p.get("throughput_per_gpu"):
        ratio = b.get("predicted_over_measured")
        lines.append(f"  predicted {p['throughput_per_gpu']:,.1f} tokens/s per GPU"
                     + (f" ({ratio:.2f}x the measured)" if ratio else ""))
    job = f", flm_jobs.id {b['job_row']}" if b["job_row"] is not None else ""
    lines.append(f"  run {b['run_id']} (flm_runs.id {b['run_row']}{job}, sweep {b['sweep']})")
    return lines


def _budget(b: dict[str, Any]) -> str:
    parts = []
    if b.get("trials"):
        parts.append(f"{b['trials']} trials")
    if b.get("node_hours"):
        parts.append(f"{b['node_hours']:g} node-hours")
    return " / ".join(parts)


def best_document(study: optuna.Study) -> dict[str, Any]:
    """The winner as a layout: a sweep's ``layouts:`` entry and the flm bench arguments."""
    t = osx.best_trial(study.get_trials(deepcopy=False))
    if t is None:
        raise UserError(f"study {study.study_name} has no measured trial yet")
    w = winner(t)
    if not w["layout"]:
        # A trial told by an older flm carried no layout; an empty one would read as 1 GPU.
        raise UserError(f"study {study.study_name}: its best trial {t.number} has no layout "
                        "recorded (told by an older flm); a study of a new name tells the "
                        "sweep's runs with their layouts")
    layout = dict(w["layout"])
    bench_args = layout.pop("bench_args", {}) or {}
    return {"study": study.study_name, "trial": w["trial"],
            "throughput_per_gpu": w["throughput_per_gpu"],
            "layout": layout, "bench_args": bench_args, "measured": w["measured"],
            "predicted": w["predicted"], "run_id": w["run_id"],
            "flm_bench": _bench_argv(layout, bench_args)}


def _bench_argv(layout: dict[str, Any], bench_args: dict[str, Any]) -> str:
    # The one argv writer: every field (engine and sharding included) as flm bench reads it.
    return bench_command(Layout.from_dict(layout), bench_args)


def trial_states(study: optuna.Study) -> list[dict[str, Any]]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        rows.append({"trial": t.number, "state": t.state.name,
                     "outcome": t.user_attrs.get(osx.A_OUTCOME, ""),
                     "value": t.values[0] if t.state == TrialState.COMPLETE and t.values else None,
                     "classification": t.user_attrs.get(osx.A_CLASSIFICATION, ""),
                     "sweep": t.user_attrs.get(osx.A_SWEEP, ""),
                     **{k: v for k, v in t.params.items()}})
    return rows
