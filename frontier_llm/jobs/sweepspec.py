"""Sweep specs: a YAML file that names models, a system, node counts and a layout space, and
expands to one job per (model, node count, layout).

The layout space is either an explicit list of layouts (``layouts:``) or a ``space:`` of value
lists that the planner enumerates, keeping only valid layouts (``auto: true`` lets the planner
choose every knob not listed; ``fits_only`` and ``top`` keep the layouts predicted to fit, or the
K fastest). Errors name the file, the line and the key (frontier_llm.specs.yamlio).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from frontier_llm.bench.config import bench_argv as bench_config_argv
from frontier_llm.catalog import SYSTEMS_DIR, load_model, load_system
from frontier_llm.errors import SpecError, UserError
from frontier_llm.jobs import unsafe
from frontier_llm.jobs.render import TEMPLATES, template_options, template_path
from frontier_llm.jobs.sbatch_options import long_form
from frontier_llm.jobs.secrets import check_pass_env, check_sweep_file, password_url, secret_name
from frontier_llm.jobs.workload import (
    FLM_BENCH,
    after_argv,
    check_layout,
    check_save_dirs,
    check_workload,
)
from frontier_llm.specs import (
    DType,
    Layout,
    ModelSpec,
    SystemSpec,
)
from frontier_llm.specs.build import build
from frontier_llm.specs.forms import label
from frontier_llm.specs.layout import MAX_COUNT, MAX_GPUS, complete_layout
from frontier_llm.specs.site import SITE_ENV_GROUPS, Site, merge
from frontier_llm.specs.space import check_space, grid_values, space_fields, space_knobs
from frontier_llm.specs.values import SAFE_NAME, check_name, check_text
from frontier_llm.specs.yamlio import LineMap, load_yaml, loads_yaml

# flm bench options a sweep (or one layout of it) may add; the rest are set from the layout.
BENCH_ARGS = {"memory_limit": "--memory-limit", "data": "--data", "fault": "--fault",
              "fault_step": "--fault-step", "bucket_mb": "--bucket-mb"}


@dataclass(frozen=True)
class ResourcesSpec:
    """What each job asks SLURM for, besides nodes and tasks (those follow from the layout)."""

    time: str = "00:30:00"
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    constraint: str | None = None
    mem: str | None = None
    exclusive: bool = False
    cpus_per_task: int | None = None
    extra_sbatch: list | None = None

    def __post_init__(self) -> None:
        if not re.fullmatch(r"(\d+-)?\d+(:\d+){0,2}", self.time):
            raise SpecError(f"time must be a SLURM time limit such as 00:30:00 or 1-00:00:00 "
                            f"(got {self.time!r})", "time")
        _str_list(self.extra_sbatch, "extra_sbatch")


@dataclass(frozen=True)
class EnvironmentSpec:
    """How a job sets itself up: modules to load, variables to export, and raw setup lines.

    ``env`` values are written into the job scripts, the sweep folder and the database;
    ``pass_env`` names variables the job takes from the submitting shell, written nowhere
    (frontier_llm.jobs.secrets)."""

    modules: list | None = None
    env: dict | None = None
    setup: list | None = None
    pass_env: list | None = None

    def __post_init__(self) -> None:
        _str_list(self.modules, "modules")
        _str_list(self.setup, "setup")
        why = check_pass_env(self.pass_env, self.env, None)
        if why:
            raise SpecError(why, "pass_env")
        if self.env is not None:
            if not isinstance(self.env, Mapping):
                raise SpecError("env must be a mapping of NAME: value", "env")
            for k, v in self.env.items():
                if not unsafe.ENV_NAME.fullmatch(str(k)):
                    raise SpecError(f"env name {k!r} is not a valid variable name", "env")
                if not isinstance(v, str | int | float | bool):
                    raise SpecError(f"env {k} must be a string or number", "env")
                if "\0" in str(v):
                    # No process environment can hold a NUL (execve(2) takes C strings): the
                    # local executor failed at start with the rows left SUBMITTING.
                    raise SpecError(f"env {k}: a NUL character cannot be in an environment "
                                    "value", "env")


def _check_sweep_space(self: Any) -> None:
    check_space(self.__dict__)
    if self.top is not None and self.top < 1:
        raise SpecError(f"top must be at least 1 (got {self.top})", "top")


# Value lists the planner enumerates: one list per layout knob of specs.space (its fields are
# made from the Layout fields, not written out), ``zero`` as the sharding's ZeRO shorthand,
# and ``auto`` (leave every unlisted knob open), ``fits_only``, ``top``. Training engines to
# compare are the ``engine`` list (default native): each engine's rules apply.
SpaceSpec = dataclasses.make_dataclass(
    "SpaceSpec",
    [("auto", bool, field(default=False)), ("fits_only", bool, field(default=True)),
     ("top", int | None, field(default=None)), *space_fields()],
    frozen=True,
    namespace={"__post_init__": _check_sweep_space,
               "__doc__": "Value lists the planner enumerates (with auto, unlisted knobs are "
                          "open)."})
SpaceSpec.__module__ = __name__


@dataclass(frozen=True)
class SweepFile:
    """The top level of a sweep YAML file, as written."""

    name: str
    system: str
    description: str = ""
    reference: str = ""
    model: str | None = None
    models: list | None = None
    template: str | None = None
    executor: Literal["slurm", "local"] = "slurm"
    nodes: list | None = None
    gpus: list | None = None
    gpus_per_node: int | None = None
    global_batch: int | None = None
    global_batch_per_node: int | None = None
    dtype: DType = DType.BF16
    steps: int = 10
    warmup: int = 2
    seed: int = 0
    space: Any = None
    layouts: list | None = None
    resources: ResourcesSpec = field(default_factory=ResourcesSpec)
    environment: EnvironmentSpec = field(default_factory=EnvironmentSpec)
    template_options: dict | None = None
    labels: dict | None = None
    bench_args: dict | None = None
    command: list | None = None
    # What each job runs: flm bench, or the user's trainer (jobs/workload.py; docs/export.md
    # "Sweeps of your own trainer") with its command or entry script.
    workload: str = FLM_BENCH
    workload_command: list | None = None
    max_array_size: int = 1000
    # Layouts of the same shape run up to ``pack`` at a time in one allocation, one srun step
    # after another (docs/sweeps.md "Packing small layouts"); 1: one allocation per layout.
    pack: int = 1
    # sequential: the steps run one after another (time x N); concurrent: all at once, in an
    # allocation of N times the layout's ranks on one node (one-node layouts, srun launcher).
    pack_mode: Literal["sequential", "concurrent"] = "sequential"
    # Overrides of the system's site section (frontier_llm.specs.site; docs/sites.md).
    site: dict | None = None
    # Variables and sbatch options that load code or move the job's files, which the sweep's
    # author asks for by name (jobs/unsafe.py; recorded in the scripts and the manifest).
    allow_unsafe: list | None = None

    def __post_init__(self) -> None:
        if not SAFE_NAME.match(self.name):
            raise SpecError(f"name {self.name!r} may hold only letters, digits, '.', '_', '-' "
                            "(it names files and jobs)", "name")
        if (self.model is None) == (self.models is None):
            raise SpecError("give exactly one of model or models", "models")
        _str_list(self.models, "models")
        if self.nodes is not None and self.gpus is not None:
            raise SpecError("give nodes or gpus, not both", "gpus")
        _int_list(self.nodes, "nodes", MAX_GPUS)
        _int_list(self.gpus, "gpus", MAX_GPUS)
        if self.global_batch is not None and self.global_batch_per_node is not None:
            raise SpecError("give global_batch or global_batch_per_node, not both",
                            "global_batch_per_node")
        if (self.space is None) == (self.layouts is None):
            raise SpecError("give exactly one of space or layouts", "space")
        if self.space is not None and self.nodes is None and self.gpus is None:
            raise SpecError("a space needs nodes (or gpus) to lay out", "nodes")
        if self.layouts is not None and not (isinstance(self.layouts, list) and self.layouts):
            raise SpecError("layouts must be a non-empty list of layouts", "layouts")
        for name in ("steps", "max_array_size", "pack"):
            if getattr(self, name) < 1:
                raise SpecError(f"{name} must be at least 1", name)
        for name in ("steps", "warmup", "max_array_size", "pack", "global_batch",
                     "global_batch_per_node", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, int) and value > MAX_COUNT:
                raise SpecError(f"{name} must be at most {MAX_COUNT:,} (got {value})", name)
        if self.warmup < 0:
            raise SpecError("warmup must be 0 or more", "warmup")
        _str_list(self.command, "command")
        _str_list(self.workload_command, "workload_command")
        for name, words in (("command", self.command),
                            ("workload_command", self.workload_command)):
            if any("\0" in w for w in words or ()):
                # execve(2) takes C strings: a local submit failed with a traceback.
                raise SpecError(f"{name}: a NUL character cannot be in a command", name)
        check_workload(self.workload, self.workload_command, self.command, self.executor,
                       self.pack, self.bench_args)
        for name in ("template_options", "labels", "bench_args", "site"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Mapping):
                raise SpecError(f"{name} must be a mapping", name)
        _check_labels(self.labels)
        unsafe.check_allowed(self.allow_unsafe)


@dataclass(frozen=True)
class SweepJob:
    """One job: a layout of a model on a number of nodes, and the bench arguments that run it."""

    key: str
    model: ModelSpec
    model_ref: str
    layout: Layout
    nodes: int
    ranks_per_node: int
    bench_args: tuple[str, ...]
    time: str
    prediction: Mapping[str, Any] = field(default_factory=dict)
    # A trainer workload's job: the log-to-trace command run when the trainer ends.
    after: tuple[str, ...] = ()

    @property
    def world_size(self) -> int:
        return self.layout.world_size


@dataclass(frozen=True)
class Sweep:
    """A validated sweep: its settings and the jobs it expands to."""

    spec: SweepFile
    source: str
    text: str
    system: SystemSpec
    system_ref: str
    template: str
    jobs: tuple[SweepJob, ...]
    skipped: Mapping[str, int]  # layouts the space named that were not valid, by reason
    site: Site = field(default_factory=Site)  # the system's site with the sweep's overrides
    per_node: int = 1  # ranks (GPUs) per node: the sweep's gpus_per_node or the system's

    @property
    def name(self) -> str:
        return self.spec.name


# Labels flm sets itself on every job of a sweep: a sweep's own label of that name would
# file its traces under another sweep or job in the database.
RESERVED_LABELS = ("sweep", "job_key")


def _check_labels(labels: Mapping | None) -> None:
    """Label names are file-name words, values one printable line; flm's own are refused."""
    for k, v in (labels or {}).items():
        check_name(str(k), "labels", safe=True)
        if str(k) in RESERVED_LABELS:
            raise SpecError(f"labels.{k} is set by flm itself (the sweep's name and each job's "
                            f"key: {', '.join(RESERVED_LABELS)}); give the label another name",
                            "labels")
        if not isinstance(v, str | int | float | bool):
            raise SpecError(f"labels.{k} must be a string or number", "labels")
        check_text(str(v), f"labels.{k}")


def _check_unsafe(spec: SweepFile, data: LineMap, system: SystemSpec | None = None,
                  system_ref: str = "") -> None:
    """Refuse the sweep's own variables (``environment.env``, its ``site.env*`` overrides, and
    the ``site.env*`` of a system file that is not a shipped one) and ``extra_sbatch`` options
    that no allow-list admits (jobs/unsafe.py), unless it opts in."""
    env = [("environment.env", str(k)) for k in spec.environment.env or {}]
    for key, value in (spec.site or {}).items():
        if str(key).startswith("env") and isinstance(value, Mapping):
            env.extend((f"site.{key}", str(k)) for k in value)
    where = {}
    if system is not None and _custom_system(system_ref):
        for group in SITE_ENV_GROUPS:
            for name, value in getattr(system.site, group):
                section = f"system file's site.{group}"
                where[section] = f"{system_ref}: "
                env.append((section, name))
                if secret_name(name) or password_url(str(value)):
                    raise SpecError(f"{system_ref}: site.{group}.{name} is named like a secret "
                                    "or holds a URL with a password (the value is not repeated "
                                    "here); site.env is written into every job script: list "
                                    "the name under the sweep's environment.pass_env instead",
                                    "site")
    for section in ("environment", "site"):
        raw = data.get(section)
        if isinstance(raw, LineMap):
            where.update({f"{section}.{k}": raw.where(k) + ": " for k in raw})
    resources = data.get("resources")
    if isinstance(resources, LineMap) and "extra_sbatch" in resources:
        where["extra_sbatch"] = resources.where("extra_sbatch") + ": "
    options = [long_form(o) for o in spec.resources.extra_sbatch or ()]
    unsafe.check(env, options, spec.allow_unsafe or (), where=where)


def _custom_system(ref: str) -> bool:
    """Whether the sweep's system is a file of its own, not a shipped one (whose ``site:`` is
    the centre's and trusted; docs/security.md)."""
    if Path(ref).suffix not in (".yaml", ".yml"):
        return False
    return Path(ref).resolve().parent != SYSTEMS_DIR.resolve()


def _str_list(value: Any, name: str) -> None:
    if value is not None and (not isinstance(value, list)
                              or not all(isinstance(v, str) for v in value)):
        raise SpecError(f"{name} must be a list of strings", name)


def _int_list(value: Any, name: str, hi: int = MAX_COUNT) -> None:
    if value is not None and (
        not isinstance(value, list) or not value
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        raise SpecError(f"{name} must be a non-empty list of whole numbers", name)
    if value and max(value) > hi:
        raise SpecError(f"{name} values must be at most {hi:,} (got {max(value)})", name)


def _where(data: Any, key: str | None = None) -> str:
    return data.where(key) + ": " if isinstance(data, LineMap) else ""


def _layout_key(model_name: str, nodes: int, p: Layout) -> str:
    """A readable key that differs for every layout knob that differs from the defaults: the
    model, the node count and the layout's one label (specs.forms.label) as path-safe words."""
    words = [re.sub(r"[^A-Za-z0-9._-]+", "_", w) for w in label(p).split()]
    return "-".join([re.sub(r"[^A-Za-z0-9._-]", "_", model_name), f"n{nodes}", *words])


def bench_argv(sweep_name: str, key: str, model_ref: str, system_ref: str, p: Layout,
               spec: SweepFile, extra: Mapping[str, Any]) -> tuple[str, ...]:
    """The ``flm bench`` arguments of one job (the run id and trace dir are added by the job):
    the one codec of frontier_llm.bench.config, with the sweep's labels and bench options."""
    options: list[str] = []
    for k, v in extra.items():
        if v is None or v is False:
            continue
        options.append(BENCH_ARGS[k])
        if v is not True:
            options.append(str(v))
    labels = {"sweep": sweep_name, "job_key": key, **{str(k): str(v) for k, v in
                                                       (spec.labels or {}).items()}}
    return tuple(bench_config_argv(model_ref, system_ref, p, steps=spec.steps,
                                   warmup=spec.warmup, seed=spec.seed, labels=labels,
                                   extra=options))


def _bench_args(raw: Any, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}bench_args must be a mapping", "bench_args")
    for k in raw:
        if k not in BENCH_ARGS:
            raise SpecError(f"{_where(raw, k) or where}unknown bench_args key '{k}' (valid: "
                            f"{', '.join(BENCH_ARGS)})", "bench_args")
    return dict(raw)


def _placement(ranks: int, per_node: int) -> tuple[int, int]:
    """(nodes, ranks per node) for a job of ``ranks`` ranks on nodes of ``per_node`` slots."""
    if ranks <= per_node:
        return 1, ranks
    if ranks % per_node:
        raise SpecError(f"{ranks} ranks do not fill whole nodes of {per_node}", "gpus_per_node")
    return ranks // per_node, per_node


# The most jobs a sweep may expand to: the controller's default MaxJobCount (slurm.conf(5)),
# beyond which it accepts no more jobs; a larger space is one left open by mistake.
MAX_SWEEP_JOBS = 10_000


def _space_jobs(spec: SweepFile, raw_space: Any, models: list[tuple[str, ModelSpec]],
                system: SystemSpec, system_ref: str, per_node: int, skipped: Counter
                ) -> list[SweepJob]:
    from frontier_llm.planner import SearchSpace, plan

    if raw_space == "auto":
        space = SpaceSpec(auto=True)
    elif isinstance(raw_space, Mapping):
        space = build(SpaceSpec, raw_space)
    else:
        raise SpecError(f"{_where(raw_space)}space must be 'auto' or a mapping of value lists",
                        "space")
    listed = {n: getattr(space, n) for n in space_knobs()}
    if space.zero is not None:
        listed["sharding"] = space.zero
    knobs: dict[str, Any] = grid_values(listed, auto=space.auto)
    counts = [(n, n * per_node) for n in spec.nodes] if spec.nodes else [
        (_placement(g, per_node)[0], g) for g in spec.gpus]
    jobs = []
    for model_ref, model in models:
        for nodes, gpus in counts:
            if spec.global_batch_per_node is not None:
                gb = spec.global_batch_per_node * nodes
            else:
                gb = spec.global_batch
            tps = knobs.get("tp")
            sub = dict(knobs)
            if tps is not None:
                sub["tp"] = tuple(t for t in tps if gpus % t == 0)
                if len(sub["tp"]) < len(tps):
                    skipped["tp does not divide the GPU count"] += len(tps) - len(sub["tp"])
                if not sub["tp"]:
                    continue
            try:
                result = plan(model, system, gpus, gb, SearchSpace(dtype=spec.dtype, **sub),
                              cp_exchange=_cp_exchange(spec))
            except UserError as exc:
                skipped[str(exc)] += 1
                continue
            for reason, count in result.rejections().items():
                if reason != "does not fit in memory" or space.fits_only:
                    skipped[reason] += count
            bench = spec.workload == FLM_BENCH and model.is_moe
            ranked = result.ranked_indices(top=None if bench else space.top,
                                           fits_only=space.fits_only)
            if bench:
                ranked = _bench_runs(model, result, ranked, space.top, skipped)
            if len(jobs) + len(ranked) > MAX_SWEEP_JOBS:
                # Said before a job is built: 35,000 jobs took most of a minute to build first.
                raise SpecError(f"the space expands to more than {MAX_SWEEP_JOBS:,} jobs "
                                f"({len(jobs) + len(ranked):,} by {gpus} GPUs of {model.name}; "
                                "SLURM's MaxJobCount is 10,000 by default, slurm.conf(5)): "
                                "give top: N, keep fits_only: true or list fewer values",
                                "space")
            for i in ranked:
                layout = result.layout(i)
                n, rpn = _placement(layout.world_size, per_node)
                key = _layout_key(model.name, n, layout)
                jobs.append(SweepJob(
                    key=key, model=model, model_ref=model_ref, layout=layout, nodes=n,
                    ranks_per_node=rpn,
                    bench_args=bench_argv(spec.name, key, model_ref, system_ref, layout, spec,
                                          _bench_args(spec.bench_args, "")),
                    time=spec.resources.time, prediction=result.prediction(i),
                ))
    return jobs


def bench_refusal(model: ModelSpec, layout: Layout) -> str | None:
    """Why ``flm bench`` would refuse ``layout`` of a Mixture-of-Experts ``model`` at its
    start (None: it runs it): the check bench makes before any process group
    (bench/engines.py ``check``), made when a sweep is loaded, so that no job is rendered to
    fail at its start. Dense models are not checked here yet: sweeps that list engines bench
    does not run (megatron, for the planner's comparison) still render them."""
    if not model.is_moe:
        return None
    from frontier_llm.bench.engines import check

    try:
        check(model, layout)
    except (UserError, SpecError) as exc:
        return str(exc)
    return None


def _bench_runs(model: ModelSpec, result, ranked, top: int | None, skipped: Counter) -> list:
    """The planner's ``ranked`` layouts that flm bench runs, fastest first, at most ``top``;
    each one left out counted in ``skipped`` under bench's reason."""
    kept = []
    for i in ranked:
        if (top is not None and len(kept) == top) or len(kept) > MAX_SWEEP_JOBS:
            break  # past MAX_SWEEP_JOBS the caller refuses the space anyway
        why = bench_refusal(model, result.layout(i))
        if why is None:
            kept.append(i)
        else:
            skipped[f"flm bench refuses it: {why}"] += 1
    return kept


def _cp_exchange(spec: SweepFile) -> str | None:
    """The context-parallel exchange the sweep's jobs run: their trainer's (torchtitan:
    PyTorch's ring), or None (the engine's rule: flm bench's own)."""
    from frontier_llm.trainers import get

    return None if spec.workload == FLM_BENCH else get(spec.workload).cp_exchange


def _predicted(model: ModelSpec, system: SystemSpec, layout: Layout,
               cp_exchange: str | None = None) -> dict[str, Any]:
    """A listed layout's prediction, the same figures a space's layouts get from the planner
    (so the walltime check sees ``layouts:`` sweeps too); {} where the cost model has none,
    and for CPU ranks (a site without GPUs: this machine's test cluster), whose listed layouts
    are written to exercise time limits and failures, not to be held to a GPU's start-up."""
    from frontier_llm.costmodel import predict
    from frontier_llm.planner.plan import PREDICTION_COLUMNS

    if system.site is not None and not system.site.gpus:
        return {}

    try:
        row = predict(model, system, layout, cp_exchange=cp_exchange)
    except (UserError, ValueError, KeyError, ZeroDivisionError):
        return {}
    return {k: row[k] for k in PREDICTION_COLUMNS if k != "hfu" and k in row}


def _explicit_jobs(spec: SweepFile, entries: list, models: list[tuple[str, ModelSpec]],
                   system: SystemSpec, system_ref: str, per_node: int) -> list[SweepJob]:
    jobs = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            raise SpecError(f"{_where(entries)}each layout is a mapping of layout fields",
                            "layouts")
        data = entry.copy() if isinstance(entry, LineMap) else dict(entry)
        where = _where(entry)
        name = data.pop("name", None)
        only_model = data.pop("model", None)
        extra = _bench_args(data.pop("bench_args", None), where)
        time = str(data.pop("time", spec.resources.time))
        ResourcesSpec(time=time)  # same rule as the sweep-wide time limit
        if name is not None and not (isinstance(name, str) and SAFE_NAME.match(name)):
            raise SpecError(f"{where}name {name!r} may hold only letters, digits, '.', '_', '-'",
                            "name")
        data.setdefault("dtype", spec.dtype)
        if spec.global_batch is not None:
            data.setdefault("global_batch", spec.global_batch)
        # The fill rules of flm bench and flm predict (global batch, interleaving, zero).
        layout = Layout.from_dict(complete_layout(data))
        n, rpn = _placement(layout.world_size, per_node)
        targets = [(r, m) for r, m in models if only_model is None or r == only_model]
        if not targets:
            raise SpecError(f"{where}model {only_model!r} is not one of the sweep's models",
                            "model")
        for model_ref, model in targets:
            try:
                layout.check_model(model)
            except SpecError as exc:
                raise SpecError(f"{where}{model.name}: {exc}", exc.field) from None
            why = bench_refusal(model, layout) if spec.workload == FLM_BENCH else None
            if why is not None:
                raise SpecError(f"{where}{model.name}: flm bench refuses this layout: {why}",
                                "layouts")
            key = name if name and len(targets) == 1 else (
                f"{name}-{model.name}" if name else _layout_key(model.name, n, layout))
            jobs.append(SweepJob(
                key=key, model=model, model_ref=model_ref, layout=layout, nodes=n,
                ranks_per_node=rpn,
                bench_args=bench_argv(spec.name, key, model_ref, system_ref, layout, spec,
                                      {**_bench_args(spec.bench_args, ""), **extra}),
                time=time, prediction=_predicted(model, system, layout, _cp_exchange(spec)),
            ))
    return jobs


def _sp_hint(space: Any, skipped: Counter) -> str:
    """Where a ``space:`` with tp > 1 and no ``sequence_parallel`` found nothing that fits: a
    space copied from flm plan's layouts (which searches it off and on, and lists tp 2 sp as
    tp 2) runs them without it, and those may not fit."""
    if (not isinstance(space, Mapping) or "sequence_parallel" in space
            or not any(int(t) > 1 for t in (space.get("tp") or ()))
            or not skipped.get("does not fit in memory")):
        return ""
    return ("; sequence_parallel is off unless the space lists it (flm plan searches it off "
            "and on): add sequence_parallel: [true] for layouts copied from flm plan's sp rows")


def _ref(name: str, source: Path) -> str:
    """A catalog name stays a name; a YAML path is made absolute (jobs run elsewhere)."""
    p = Path(name)
    if p.suffix in (".yaml", ".yml"):
        if not p.is_absolute():
            p = (source.parent / p) if (source.parent / p).is_file() else p
        return str(p.resolve())
    return name


def _drop_old_engine_key(top: LineMap) -> None:
    """A top-level ``engine:`` was once a field that could only say ``native`` and was never
    read. Sweep folders and the database keep such files (flm report reloads them), so
    ``engine: native`` is still accepted and means nothing; any other word is refused with
    where the engine goes now (it is a layout knob: one place, the layouts)."""
    if "engine" not in top:
        return
    if top["engine"] == "native":
        del top["engine"]
        return
    raise SpecError(f"{top.where('engine')}: the engine is a layout knob: list it under "
                    f"space (engine: [native, deepspeed]) or give it in each layouts entry "
                    f"(engine: deepspeed), not at the top level", "engine")


def _trainer_jobs(spec: SweepFile, jobs: list[SweepJob], system_ref: str, data: LineMap
                  ) -> list[SweepJob]:
    """Each job of a trainer workload, refused in one line (naming the job) where the trainer
    cannot express its layout; else with the command that turns its log into its trace."""
    out = []
    try:
        check_save_dirs(spec.workload, spec.workload_command or (), len(jobs))
    except SpecError as exc:
        raise SpecError(f"{data.where('workload_command')}: {exc}", exc.field) from None
    for j in jobs:
        try:
            check_layout(spec.workload, j.model, j.layout, j.key)
        except SpecError as exc:
            raise SpecError(f"{data.where('workload')}: {exc}", exc.field) from None
        out.append(dataclasses.replace(j, after=after_argv(
            spec.workload, j.model_ref, system_ref, j.layout, spec.name, j.key)))
    return out


def load_sweep(path: str | Path, text: str | None = None) -> Sweep:
    """Read, validate and expand a sweep file (``text``: its content, when the caller made it,
    e.g. flm tune's one-trial sweeps; errors still name ``path``)."""
    path = Path(path)
    data = load_yaml(path) if text is None else loads_yaml(text, source=str(path))
    if not isinstance(data, LineMap):
        raise SpecError(f"{path}:1: a sweep file holds a mapping of settings")
    # Before anything else reads it: a credential in the file is refused, whatever else is wrong.
    check_sweep_file(data)
    # Nested sections are built on their own so that their errors keep their own line.
    top = data.copy()
    _drop_old_engine_key(top)
    nested = {}
    for key, cls in (("resources", ResourcesSpec), ("environment", EnvironmentSpec)):
        if key in top:
            raw = top.pop(key)
            if not isinstance(raw, Mapping):
                raise SpecError(f"{data.where(key)}: {key} must be a mapping", key)
            nested[key] = build(cls, raw)
    spec = build(SweepFile, top)
    if nested:
        spec = dataclasses.replace(spec, **nested)
    why = check_pass_env(spec.environment.pass_env, None, spec.resources.extra_sbatch)
    if why:
        raise SpecError(f"{data['resources'].where('extra_sbatch')}: {why}", "extra_sbatch")
    template = spec.template
    system_ref = _ref(spec.system, path)
    try:
        system = load_system(system_ref)
    except UserError as exc:
        raise SpecError(f"{data.where('system')}: {exc}", "system") from None
    _check_unsafe(spec, data, system, system_ref)
    try:
        site = merge(system.site, spec.site)
    except SpecError as exc:
        raise SpecError(f"{data.where('site')}: {exc}", "site") from None
    # The site names its template family; the sweep may name another or its own file (a path
    # relative to the sweep file).
    template = template or site.template
    if template not in TEMPLATES:
        try:
            template = str(template_path(template, base=path.parent))
        except SpecError as exc:
            raise SpecError(f"{data.where('template')}: {exc}", "template") from None
    try:
        known = template_options(template)
    except SpecError as exc:
        raise SpecError(f"{data.where('template')}: {exc}", "template") from None
    for k in spec.template_options or {}:
        if known is not None and k not in known:
            name = template if template in TEMPLATES else Path(template).name
            raise SpecError(f"{data['template_options'].where(k)}: unknown template option "
                            f"'{k}' for {name} (valid: {', '.join(known)})",
                            "template_options")
    models = []
    for ref in spec.models or [spec.model]:
        ref = _ref(ref, path)
        try:
            models.append((ref, load_model(ref)))
        except UserError as exc:
            key = "models" if spec.models else "model"
            raise SpecError(f"{data.where(key)}: {exc}", key) from None
    per_node = spec.gpus_per_node or system.gpus_per_node
    if spec.pack_mode == "concurrent" and (site.launcher != "srun"
                                           or site.binding == "cpu-masks"):
        # Concurrent steps need srun to give each its own devices and cores: torchrun owns
        # whole nodes, and CPU masks are per local task id, so two steps would share them.
        raise SpecError(f"{data.where('pack_mode')}: pack_mode concurrent needs the srun "
                        f"launcher without cpu-masks binding (site {system.name}: launcher "
                        f"{site.launcher}, binding {site.binding})", "pack_mode")
    skipped: Counter = Counter()
    try:
        if spec.layouts is not None:
            jobs = _explicit_jobs(spec, spec.layouts, models, system, system_ref, per_node)
        else:
            jobs = _space_jobs(spec, spec.space, models, system, system_ref, per_node, skipped)
    except SpecError as exc:
        msg = str(exc)
        if not msg.startswith(str(path)):
            key = "layouts" if spec.layouts is not None else "space"
            msg = f"{data.where(key)}: {msg}"
        raise SpecError(msg, exc.field) from None
    if spec.workload != FLM_BENCH:
        jobs = _trainer_jobs(spec, jobs, system_ref, data)
    seen: dict[str, int] = {}
    for j in jobs:
        seen[j.key] = seen.get(j.key, 0) + 1
    dups = [k for k, c in seen.items() if c > 1]
    if dups:
        raise SpecError(f"{data.where('layouts' if spec.layouts else 'space')}: two jobs share "
                        f"the key {dups[0]!r}; give each layout its own name", "layouts")
    if not jobs:
        why = "; ".join(f"{r}: {c}" for r, c in skipped.most_common(3))
        raise SpecError(f"{path}: the sweep expands to no valid layout ({why or 'empty'})"
                        + _sp_hint(spec.space, skipped), "space")
    return Sweep(spec=spec, source=str(path), text=path.read_text() if text is None else text,
                 system=system,
                 system_ref=system_ref, template=template, jobs=tuple(jobs),
                 skipped=dict(skipped), site=site, per_node=per_node)

