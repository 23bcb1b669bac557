"""The ``study:`` section of a sweep file: what ``flm tune`` searches, for what, with what budget.

A study file is a sweep file (docs/sweeps.md) whose layout space sits under ``study:``
instead of a top-level ``space:``/``layouts:``. Everything else (model, system, template,
executor, resources, environment, steps) is the sweep's and is checked by the sweep loader, so
an error names the file and line either way. Each trial becomes a one-layout sweep made from the
same text: the ``study:`` block is blanked (line numbers stay) and the trial's layout appended.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from frontier_llm.errors import SpecError, UserError
from frontier_llm.jobs.sweepspec import SAFE_NAME, Sweep, load_sweep
from frontier_llm.specs.build import build
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.space import check_list, check_space, space_fields
from frontier_llm.specs.system import SystemSpec
from frontier_llm.specs.yamlio import LineMap, load_yaml

# Objective name -> Optuna direction. The first objective is always throughput per GPU.
OBJECTIVES = {"throughput_per_gpu": "maximize", "peak_memory": "minimize",
              "node_hours": "minimize"}
SAMPLERS = ("tpe", "gp", "nsgaii", "random", "grid")
# Run settings a study may search: flm bench options that are not layout knobs (bench_args key).
RUN_SETTINGS = ("bucket_mb",)


def _where(data: Any, key: str | None = None) -> str:
    return data.where(key) + ": " if isinstance(data, LineMap) else ""


def _check_space(self: Any) -> None:
    check_space(self.__dict__)
    if self.run is not None:
        if not isinstance(self.run, Mapping):
            raise SpecError("run must be a mapping of run setting: [values]", "run")
        for k, v in self.run.items():
            if k not in RUN_SETTINGS:
                raise SpecError(f"{_where(self.run, k)}unknown run setting '{k}' (valid: "
                                f"{', '.join(RUN_SETTINGS)})", "run")
            check_list(v, f"run.{k}", (int, float))
            if any(x <= 0 for x in v):
                raise SpecError(f"{_where(self.run, k)}run.{k} values must be above 0", "run")


def _canonical(self: Any) -> dict[str, Any]:
    """The space as plain data (compared with a stored study's)."""
    out = {k: v for k, v in self.__dict__.items() if v is not None and k != "run"}
    if self.run:
        out["run"] = {k: list(v) for k, v in sorted(self.run.items())}
    return out


# Value lists for each searchable layout knob (an unlisted knob stays at one value; tp and pp:
# every divisor), ``zero`` as the sharding's ZeRO shorthand, and ``run`` settings
# ({bucket_mb: [...]}). Its fields are made from specs.space, not written out.
StudySpace = dataclasses.make_dataclass(
    "StudySpace",
    [*space_fields(), ("run", dict | None, field(default=None))],
    frozen=True,
    namespace={"__post_init__": _check_space, "canonical": _canonical,
               "__doc__": "Value lists for each knob; an unlisted knob stays at one value "
                          "(tp, pp: every divisor)."})
StudySpace.__module__ = __name__


@dataclass(frozen=True)
class Budget:
    """When the study stops asking: after ``trials`` measured trials and/or ``node_hours``."""

    trials: int | None = None
    node_hours: float | None = None

    def __post_init__(self) -> None:
        if self.trials is None and self.node_hours is None:
            raise SpecError("budget needs trials and/or node_hours", "trials")
        if self.trials is not None and self.trials < 1:
            raise SpecError(f"budget trials must be at least 1 (got {self.trials})", "trials")
        if self.node_hours is not None and self.node_hours <= 0:
            raise SpecError(f"budget node_hours must be above 0 (got {self.node_hours})",
                            "node_hours")


@dataclass(frozen=True)
class StudySection:
    """The ``study:`` mapping as written (space and budget are built on their own)."""

    space: Any
    budget: Any
    name: str | None = None
    objective: Any = "throughput_per_gpu"
    sampler: Literal["tpe", "gp", "nsgaii", "random", "grid"] = "tpe"
    seed: int = 0
    in_flight: int = 1
    # The K layouts the cost model predicts fastest are the first trials (0: none).
    warm_start: int = 3
    description: str = ""

    def __post_init__(self) -> None:
        if self.name is not None and not SAFE_NAME.match(self.name):
            raise SpecError(f"name {self.name!r} may hold only letters, digits, '.', '_', '-'",
                            "name")
        if self.in_flight < 1:
            raise SpecError(f"in_flight must be at least 1 (got {self.in_flight})", "in_flight")
        if self.warm_start < 0:
            raise SpecError("warm_start must be 0 or more", "warm_start")
        objectives = self.objectives
        for o in objectives:
            if o not in OBJECTIVES:
                raise SpecError(f"unknown objective {o!r} (valid: {', '.join(OBJECTIVES)})",
                                "objective")
        if objectives[0] != "throughput_per_gpu" or len(objectives) > 2 or len(
                set(objectives)) != len(objectives):
            raise SpecError("objective is throughput_per_gpu, optionally with a second one: "
                            "[throughput_per_gpu, peak_memory] or [throughput_per_gpu, "
                            "node_hours]", "objective")

    @property
    def objectives(self) -> tuple[str, ...]:
        if isinstance(self.objective, str):
            return (self.objective,)
        if isinstance(self.objective, list) and all(isinstance(o, str) for o in self.objective):
            return tuple(self.objective)
        raise SpecError("objective must be a name or a list of names", "objective")


@dataclass(frozen=True)
class StudyFile:
    """A loaded study: its settings, the sweep it is made of, and the model's view of its space."""

    name: str
    source: Path
    section: StudySection
    space: Any  # StudySpace
    budget: Budget
    base_text: str  # the file with the study block and name line blanked
    probe: Sweep  # the base sweep, validated with a one-rank layout
    model: ModelSpec
    system: SystemSpec
    gpus: int
    global_batch: int
    candidates: Any = field(repr=False, default=None)  # tune.space.Candidates

    @property
    def objectives(self) -> tuple[str, ...]:
        return self.section.objectives

    @property
    def directions(self) -> list[str]:
        return [OBJECTIVES[o] for o in self.objectives]

    @property
    def executor(self) -> str:
        return self.probe.spec.executor

    def identity(self) -> str:
        """What must not change under a study's name: its space, model, system, size, batch
        and objectives (a study resumed with another would mix incomparable trials)."""
        return json.dumps({
            "space": self.space.canonical(), "model": self.model.name,
            "system": self.system.name, "gpus": self.gpus, "global_batch": self.global_batch,
            "objectives": list(self.objectives), "dtype": self.probe.spec.dtype,
            "steps": self.probe.spec.steps,
        }, sort_keys=True)

    def trial_name(self, number: int) -> str:
        return f"{self.name}.t{number:04d}"

    def trial_text(self, number: int, layout_entry: Mapping[str, Any]) -> str:
        """The one-layout sweep file of trial ``number`` (same lines as the study file)."""
        entry = {**layout_entry, "name": f"t{number:04d}"}
        return (self.base_text.rstrip("\n") + f"\nname: {self.trial_name(number)}\n"
                "layouts:\n  - " + json.dumps(entry, sort_keys=True) + "\n")

    def trial_sweep(self, number: int, layout_entry: Mapping[str, Any]) -> Sweep:
        return load_sweep(self.source, text=self.trial_text(number, layout_entry))


def _blank(text: str, first: int, last: int) -> str:
    """``text`` with lines first..last (1-based, inclusive) emptied, so other lines keep their
    numbers in error messages."""
    lines = text.split("\n")
    for i in range(first - 1, min(last, len(lines))):
        lines[i] = ""
    return "\n".join(lines)


def _block_end(data: LineMap, key: str, n_lines: int) -> int:
    start = data.line_of(key)
    later = [line for line in data.key_lines.values() if line > start]
    return (min(later) - 1) if later else n_lines


def load_study(path: str | Path, name: str | None = None) -> StudyFile:
    """Read and check a study file; plan its space with the cost model (tune.space)."""
    from frontier_llm.tune.space import Candidates

    path = Path(path)
    data = load_yaml(path)
    if not isinstance(data, LineMap):
        raise SpecError(f"{path}:1: a study file holds a mapping of settings")
    if "study" not in data:
        raise SpecError(f"{path}:1: no 'study:' section (flm tune needs one; see docs/tune.md)",
                        "study")
    for key in ("space", "layouts"):
        if key in data:
            raise SpecError(f"{data.where(key)}: a study's space goes under 'study: space:' "
                            f"(remove the top-level '{key}')", key)
    raw = data["study"]
    if not isinstance(raw, Mapping):
        raise SpecError(f"{data.where('study')}: study must be a mapping", "study")
    top = raw.copy() if isinstance(raw, LineMap) else dict(raw)
    for key in ("space", "budget"):
        if key not in top:
            raise SpecError(f"{_where(raw) or data.where('study') + ': '}study needs "
                            f"'{key}:'", key)
        if not isinstance(top[key], Mapping):
            raise SpecError(f"{_where(raw, key)}{key} must be a mapping", key)
    space = build(StudySpace, top["space"])
    budget = build(Budget, top["budget"])
    section = build(StudySection, top)

    text = path.read_text()
    n_lines = text.count("\n") + 1
    base = _blank(text, data.line_of("study"), _block_end(data, "study", n_lines))
    if "name" in data:
        base = _blank(base, data.line_of("name"), data.line_of("name"))
    else:
        raise SpecError(f"{path}:1: the study file needs a name", "name")
    study_name = name or section.name or str(data["name"])
    if not SAFE_NAME.match(study_name):
        raise UserError(f"study name {study_name!r} may hold only letters, digits, '.', '_', "
                        "'-'")
    if "models" in data:
        raise SpecError(f"{data.where('models')}: a study tunes one model: use 'model:'",
                        "models")
    # The base sweep, checked with the simplest layout: its errors are the sweep's own.
    probe_text = (base.rstrip("\n") + f"\nname: {study_name}.probe\n"
                  "layouts:\n  - {dp: 1, micro_batch: 1, name: probe}\n")
    if "global_batch" in data or "global_batch_per_node" in data:
        pass
    else:
        raise SpecError(f"{path}:1: a study needs global_batch (or global_batch_per_node): "
                        "throughputs are compared at one batch", "global_batch")
    probe = load_sweep(path, text=probe_text)
    spec = probe.spec
    counts = spec.gpus or spec.nodes
    key = "gpus" if spec.gpus else "nodes"
    if not counts or len(counts) != 1:
        raise SpecError(f"{data.where(key) if key in data else str(path) + ':1'}: a study "
                        "needs one GPU count: gpus: [N] or nodes: [N]", key)
    per_node = spec.gpus_per_node or probe.system.gpus_per_node
    gpus = counts[0] if spec.gpus else counts[0] * per_node
    nodes = -(-gpus // per_node)
    gb = spec.global_batch if spec.global_batch is not None else (
        spec.global_batch_per_node * nodes)
    job = probe.jobs[0]
    study = StudyFile(name=study_name, source=path, section=section, space=space,
                      budget=budget, base_text=base, probe=probe, model=job.model,
                      system=probe.system, gpus=gpus, global_batch=gb)
    try:
        cands = Candidates.build(study)
    except UserError as exc:
        where = raw.where("space") if isinstance(raw, LineMap) else data.where("study")
        raise SpecError(f"{where}: {exc}", "space") from None
    if not cands.feasible():
        why = "; ".join(f"{r}: {c}" for r, c in sorted(cands.rejections().items(),
                                                       key=lambda kv: -kv[1])[:3])
        raise SpecError(f"{raw.where('space') if isinstance(raw, LineMap) else path}: the "
                        f"space holds no layout of {study.model.name} on {gpus} ranks that is "
                        f"valid and predicted to fit ({why or 'empty'})", "space")
    return _with(study, candidates=cands)


def _with(study: StudyFile, **changes: Any) -> StudyFile:
    import dataclasses

    return dataclasses.replace(study, **changes)


_TRIAL = re.compile(r"\A(?P<study>.+)\.t(?P<number>\d{4,})\Z")


def parse_trial_name(sweep_name: str) -> tuple[str, int] | None:
    """(study, trial number) from a trial's sweep name, else None."""
    m = _TRIAL.match(sweep_name)
    return (m["study"], int(m["number"])) if m else None
