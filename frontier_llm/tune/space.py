"""A study's search space as Optuna parameters, with the cost model's verdict on every point.

Each listed knob with more than one value is one categorical parameter (schedule and virtual
stages are one parameter: ``1f1b``, ``gpipe``, ``interleaved:2``); run settings are parameters
``run.<name>``. The planner evaluates the whole product once, so looking a proposal up is a
dictionary access: valid and predicted to fit, breaking a rule (with the rule), or predicted not
to fit (with the predicted peak memory).
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from optuna.distributions import CategoricalDistribution

from frontier_llm.errors import SpecError, UserError
from frontier_llm.jobs.sweepspec import bench_refusal
from frontier_llm.planner import SearchSpace, plan
from frontier_llm.planner.space import open_degrees
from frontier_llm.specs import axes
from frontier_llm.specs.forms import label, layout_from_row
from frontier_llm.specs.layout import (
    Layout,
    Sharding,
    merge_schedule,
    parse_schedule_label,
    row_schedule,
)
from frontier_llm.specs.space import ALWAYS_OPEN, grid_values, space_knobs
from frontier_llm.tune.runcost import run_seconds

NOT_A_LAYOUT = "not a layout of the ranks"
NO_FIT = "does not fit in memory"
_PREDICTED = ("step_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "peak_memory_bytes")


@dataclass(frozen=True)
class Candidate:
    """One point of the space: its layout (None when it is not one), run settings, the first
    rule it breaks ("" when none) and the cost model's prediction."""

    params: Mapping[str, Any]
    layout: Layout | None
    run: Mapping[str, Any]
    reason: str
    prediction: Mapping[str, Any] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return self.layout is not None and self.reason in ("", NO_FIT)

    @property
    def fits(self) -> bool:
        return self.layout is not None and self.reason == ""

    @property
    def key(self) -> str:
        """Identifies the measurement: equal keys measure the same thing."""
        return json.dumps(dict(sorted(self.params.items())), sort_keys=True, default=str)

    def layout_entry(self) -> dict[str, Any]:
        """The layout as a sweep's ``layouts:`` entry (run settings as bench_args)."""
        assert self.layout is not None
        d = self.layout.to_dict()
        d.pop("zero_stage", None)
        if self.run:
            d["bench_args"] = dict(self.run)
        return d

    def describe(self) -> str:
        if self.layout is None:
            return ", ".join(f"{k}={v}" for k, v in self.params.items())
        return label(self.layout) + "".join(f" {k}={v}" for k, v in self.run.items())


class Candidates:
    """The space of one study, planned once."""

    def __init__(self, choices: dict[str, list], fixed: dict[str, Any],
                 table: dict[tuple, Candidate], gpus: int, plan_rejections: dict[str, int],
                 memory_bytes: float, global_batch: int, dtype: str) -> None:
        self.choices = choices  # parameter -> values (only knobs with several values)
        self.fixed = fixed  # knob -> its one value
        self._table = table
        self.gpus = gpus
        self._rejections = plan_rejections
        self.memory_bytes = memory_bytes
        self.global_batch = global_batch
        self.dtype = dtype

    # --- construction ---------------------------------------------------------------------
    @classmethod
    def build(cls, study, price_runs: bool = True) -> Candidates:
        """Plan the study's space; ``price_runs=False`` leaves run settings unpriced
        (tune.runcost), as the benchmark's ablation does."""
        s, model, gpus = study.space, study.model, study.gpus
        dtype = study.probe.spec.dtype
        kinds = space_knobs()
        # Every knob: its listed values, else its grid default (specs.space), an open degree
        # expanded to the planner's list. Schedule and virtual stages are one parameter
        # (virtual stages mean something only interleaved).
        listed = {n: getattr(s, n) for n in kinds}
        if s.zero:
            listed["sharding"] = s.zero
        lists = {n: list(v) if v is not None else None
                 for n, v in grid_values(listed).items()}
        for name in ALWAYS_OPEN:
            lists[name] = lists[name] or list(open_degrees(name, model, gpus,
                                                           pps=tuple(lists["pp"] or ())))
        planned = {n: tuple(v) for n, v in lists.items()}  # the planner's lists
        lists = merge_schedule(lists)
        lists["sharding"] = [Sharding.parse(t).describe() for t in lists["sharding"]]
        knobs: dict[str, list] = {n: lists[n] for n in kinds if n in lists}
        for k, values in sorted((s.run or {}).items()):
            knobs[f"run.{k}"] = list(values)
        choices = {k: v for k, v in knobs.items() if len(v) > 1}
        fixed = {k: v[0] for k, v in knobs.items() if len(v) == 1}

        ok_tp = tuple(t for t in knobs["tp"] if gpus % t == 0)
        if not ok_tp:
            raise UserError(f"no tp value divides the {gpus} ranks")
        space = SearchSpace(dtype=dtype, **{**planned, "tp": ok_tp})
        result = plan(model, study.system, gpus, study.global_batch, space)
        frame = result.frame()
        table: dict[tuple, Candidate] = {}
        run_names = [k[4:] for k in knobs if k.startswith("run.")]
        runs = [dict(zip(run_names, combo, strict=True))
                for combo in itertools.product(*(knobs[f"run.{k}"] for k in run_names))]
        for _, row in frame.iterrows():
            reason = str(row["reject_reason"])
            layout = layout_from_row(row) if reason in ("", NO_FIT) else None
            # A trial runs flm bench: a layout it refuses at its start is no candidate (its
            # trial sweep would not load), the reason its own.
            why = bench_refusal(model, layout) if layout is not None else None
            if why is not None:
                layout, reason = None, f"flm bench refuses it: {why}"
            pred = {}
            if layout is not None:
                pred = {k: _plain(row[k]) for k in _PREDICTED}
                pred["fits"] = bool(row["fits"])
                pred["throughput_per_gpu"] = pred["tokens_per_s"] / gpus
            base = {n: _param_value(row, n, kinds[n]) for n in knobs if n in kinds}
            for run in runs:
                values = {**base, **{f"run.{k}": v for k, v in run.items()}}
                params = {k: values[k] for k in choices}
                cand = Candidate(params=params, layout=layout, run=run, reason=reason,
                                 prediction=_with_run(pred, model, study.system, layout, run)
                                 if price_runs else pred)
                table[_key(values, knobs)] = cand
        return cls(choices, fixed, table, gpus, result.rejections(),
                   study.system.memory_bytes, study.global_batch, dtype)

    # --- Optuna's view ----------------------------------------------------------------------
    @property
    def distributions(self) -> dict[str, CategoricalDistribution]:
        return {k: CategoricalDistribution(v) for k, v in self.choices.items()}

    def lookup(self, params: Mapping[str, Any]) -> Candidate:
        """The candidate of a proposal (every knob not proposed takes its fixed value)."""
        values = {**self.fixed, **params}
        knobs = {**{k: [v] for k, v in self.fixed.items()}, **self.choices}
        found = self._table.get(_key(values, knobs))
        if found is not None:
            return found
        run = {k[4:]: v for k, v in values.items() if k.startswith("run.")}
        return Candidate(params=dict(params), layout=None, run=run,
                         reason=self._why_not(values))

    def _why_not(self, v: Mapping[str, Any]) -> str:
        degrees = {a: int(axes.degree(v, a)) for a in axes.MODEL_AXES}
        dp = axes.data_parallel_for(self.gpus, degrees)
        if dp is None:
            # The degrees a layout without them would not show are left out (tp x pp at cp 1).
            named = {a: d for a, d in degrees.items() if a in axes.LABELLED or d != 1}
            return (f"{' x '.join(named)} ({' x '.join(map(str, named.values()))}) does not "
                    f"divide the {self.gpus} ranks")
        knobs = {n: v[n] for n in space_knobs() if n in v}
        knobs.update(parse_schedule_label(v["schedule"]), sharding=Sharding.parse(v["sharding"]))
        try:
            Layout(dp=dp, global_batch=self.global_batch, **knobs)
        except SpecError as exc:
            return str(exc)
        return NOT_A_LAYOUT

    # --- views of the whole space -----------------------------------------------------------
    def all(self) -> list[Candidate]:
        return list(self._table.values())

    def feasible(self) -> list[Candidate]:
        """Valid and predicted to fit."""
        return [c for c in self._table.values() if c.fits]

    def ranked(self, k: int | None = None) -> list[Candidate]:
        """Feasible candidates, fastest predicted first (ties: the order of the space)."""
        out = sorted(self.feasible(), key=lambda c: -c.prediction["tokens_per_s"])
        return out if k is None else out[:k]

    def warm_start_points(self, k: int) -> list[dict[str, Any]]:
        """The parameters of the ``k`` distinct layouts the model predicts fastest, fastest
        first. Each layout comes once, with the run settings predicted best for it; a run setting
        the model cannot tell apart (every value predicted the same for that layout) is left
        out, for the sampler to choose. So ``k`` trials try ``k`` layouts, not one layout's run
        settings (which the cost model may not even see)."""
        by_layout: dict[tuple, list[Candidate]] = {}
        for c in self.ranked():
            layout_key = tuple((n, str(v)) for n, v in sorted(c.params.items())
                               if not n.startswith("run."))
            by_layout.setdefault(layout_key, []).append(c)
        out = []
        for group in list(by_layout.values())[:k]:
            best = group[0]
            params = dict(best.params)
            for name in [n for n in params if n.startswith("run.")]:
                alike = [c for c in group if all(c.params[m] == best.params[m]
                                                 for m in params if m != name)]
                speeds = {c.prediction["tokens_per_s"] for c in alike}
                if len(alike) > 1 and max(speeds) - min(speeds) <= 1e-9 * max(speeds):
                    del params[name]
            out.append(params)
        return out

    def rejections(self) -> dict[str, int]:
        counts = Counter(self._rejections)
        return dict(counts)

    def size(self) -> int:
        return math.prod(len(v) for v in self.choices.values())


def _param_value(row: Any, name: str, kind: type) -> Any:
    """A plan row's value of knob ``name`` as the study's parameter takes it."""
    if name == "schedule":
        return row_schedule(row)
    if kind is int:
        return int(row[name])
    if kind is bool:
        return bool(row[name])
    return str(row[name])


def _with_run(pred: dict, model: Any, system: Any, layout: Layout | None,
              run: Mapping[str, Any]) -> dict:
    """The layout's prediction with what its run settings cost (tune.runcost)."""
    if layout is None or not pred:
        return pred
    extra = run_seconds(model, system, layout, run)
    if not extra:
        return pred
    out = dict(pred)
    out["step_time_s"] = pred["step_time_s"] + extra
    scale = pred["step_time_s"] / out["step_time_s"]
    for k in ("tokens_per_s", "model_tflops_per_gpu", "mfu", "throughput_per_gpu"):
        out[k] = pred[k] * scale
    out["run_settings_s"] = extra
    return out


def _key(values: Mapping[str, Any], knobs: Mapping[str, list]) -> tuple:
    def word(k: str) -> str:
        # A proposed etp equal to tp is the layout's stored 0 (specs/axes.py): one candidate.
        if k == axes.EXPERT_TP and str(values[k]) == str(values.get("tp")):
            return "0"
        return str(values[k])
    return tuple((k, word(k)) for k in sorted(knobs))


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value
