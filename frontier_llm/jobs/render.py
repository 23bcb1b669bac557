"""Render batch scripts from Jinja2 templates: a pure function of a :class:`JobScript`.

Safety rule: every value that reaches a script passes the ``q`` filter (``shlex.quote``), so a
sweep value holding ``$(...)``, backticks, ``;`` or newlines arrives in the job as the literal
string it was. The only text that is not quoted is what must be code: the sweep's ``setup``
lines (module loads and the like, written by the sweep's author as shell on purpose) and
integers. ``#SBATCH`` values are quoted too (sbatch reads shell-style quotes in directives) and
checked for newlines, which no quoting can make safe in a directive line.

One script serves one job or an array of jobs with the same resources: the task is chosen by
``SLURM_ARRAY_TASK_ID`` (0 when not an array), and its ``flm bench`` command line is set as the
positional parameters, never re-parsed by the shell.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import jinja2

from frontier_llm import __version__
from frontier_llm.errors import SpecError

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "job_templates"
TEMPLATES = ("frontier", "nvidia", "local")

# Options each template understands (sweep key ``template_options``) and their defaults.
TEMPLATE_OPTIONS: dict[str, dict[str, str | None]] = {
    "frontier": {
        # The aws-ofi-rccl plugin's lib folder; it is a site install, so no default path: the
        # job then needs RCCL_PLUGIN_DIR in its environment.
        "rccl_plugin_dir": None,
        "socket_ifname": "hsn0",
        "miopen_cache_root": "/tmp",
        "master_port": "29500",
    },
    "nvidia": {
        "launcher": "srun",  # srun (one task per GPU) or torchrun (one per node)
        "socket_ifname": None,
        "ib_hca": None,
        "master_port": "29500",
    },
    "local": {
        "master_port": "29500",
    },
}
# ROCm stack the Frontier jobs load unless the sweep names its own modules (OLCF user guide).
DEFAULT_MODULES = {
    "frontier": ("PrgEnv-gnu", "rocm/5.7.1", "craype-accel-amd-gfx90a"),
    "nvidia": (),
    "local": (),
}

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass(frozen=True)
class Resources:
    """What one job asks SLURM for. ``None`` leaves the cluster's default."""

    nodes: int = 1
    ntasks_per_node: int = 1
    cpus_per_task: int | None = None
    gpus_per_node: int | None = None
    time: str = "00:30:00"
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    constraint: str | None = None
    mem: str | None = None
    exclusive: bool = False
    overcommit: bool = False  # more tasks than cores (the local CPU cluster)
    extra: tuple[str, ...] = ()  # further sbatch options, one "--name=value" each

    def __post_init__(self) -> None:
        for name in ("time", "account", "partition", "qos", "constraint", "mem"):
            _no_newline(getattr(self, name), name)
        for opt in self.extra:
            _no_newline(opt, "extra_sbatch")
            if not opt.startswith("--"):
                raise SpecError(f"extra_sbatch options start with '--' (got {opt!r})",
                                "extra_sbatch")
        for name in ("nodes", "ntasks_per_node"):
            if getattr(self, name) < 1:
                raise SpecError(f"{name} must be at least 1 (got {getattr(self, name)})", name)

    @property
    def ntasks(self) -> int:
        return self.nodes * self.ntasks_per_node


@dataclass(frozen=True)
class Task:
    """One job of the script: its key (unique in the sweep) and its ``flm bench`` arguments."""

    index: int
    key: str
    argv: tuple[str, ...]

    def __post_init__(self) -> None:
        if not _SAFE_NAME.match(self.key):
            raise SpecError(f"job key {self.key!r} may hold only letters, digits, '.', '_', '-'",
                            "key")


@dataclass(frozen=True)
class JobScript:
    """Everything a template needs; rendering it has no other input."""

    template: str  # a name in TEMPLATES or a path to a .sh.j2 file
    sweep: str
    job_name: str
    trace_dir: str
    log_pattern: str  # sbatch --output pattern (%A array job id, %a task index)
    resources: Resources
    tasks: tuple[Task, ...]
    modules: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    setup: tuple[str, ...] = ()
    options: Mapping[str, str | None] = field(default_factory=dict)
    command: tuple[str, ...] = ("flm", "bench")  # what runs each rank, before the task's args

    def __post_init__(self) -> None:
        if not self.tasks:
            raise SpecError("a job script needs at least one task", "tasks")
        if not _SAFE_NAME.match(self.sweep):
            raise SpecError(
                f"sweep name {self.sweep!r} may hold only letters, digits, '.', '_', '-'", "name")
        for name, _ in self.env:
            if not _ENV_NAME.match(name):
                raise SpecError(
                    f"environment variable name {name!r} is not a valid shell name", "env")
        for line in self.setup:
            _no_newline(line, "setup")
        _no_newline(self.log_pattern, "log_pattern")
        _no_newline(self.job_name, "job_name")


def _no_newline(value: str | None, name: str) -> None:
    if value is not None and ("\n" in value or "\r" in value):
        raise SpecError(f"{name} must be one line (it holds a newline)", name)


def shell_quote(value: object) -> str:
    """The ``q`` filter: one shell word that is exactly ``str(value)``."""
    if isinstance(value, bool):
        value = "true" if value else "false"
    return shlex.quote(str(value))


@lru_cache(maxsize=8)
def _environment(folder: str) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([folder, str(TEMPLATE_DIR)]),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # shell, not HTML: quoting is the q filter's job
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = shell_quote
    return env


def template_path(name: str) -> Path:
    """The file behind a template name (or a user's own template file)."""
    if name in TEMPLATES:
        return TEMPLATE_DIR / f"{name}.sh.j2"
    path = Path(name)
    if path.suffix != ".j2" or not path.is_file():
        raise SpecError(
            f"template must be one of {', '.join(TEMPLATES)} or a path to a .sh.j2 file "
            f"(got {name!r})", "template")
    return path.resolve()


def render(job: JobScript) -> str:
    """The batch script text for ``job``: same input, same text (no clock, no host)."""
    path = template_path(job.template)
    base = job.template if job.template in TEMPLATES else "local"
    options = {**TEMPLATE_OPTIONS.get(base, {}), **dict(job.options)}
    if base == "nvidia" and options.get("launcher") not in ("srun", "torchrun"):
        raise SpecError(
            f"template_options.launcher must be srun or torchrun (got {options.get('launcher')!r})",
            "template_options")
    if not str(options.get("master_port", "29500")).isdigit():
        raise SpecError("template_options.master_port must be a port number", "template_options")
    modules = job.modules or DEFAULT_MODULES.get(base, ())
    template = _environment(str(path.parent)).get_template(path.name)
    return template.render(
        job=job,
        r=job.resources,
        tasks=job.tasks,
        modules=modules,
        options=options,
        version=__version__,
    )
