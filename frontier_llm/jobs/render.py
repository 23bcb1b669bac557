"""Render batch scripts from Jinja2 templates: a pure function of a :class:`JobScript`.

Safety rule: every value that reaches a script passes the ``q`` filter (``shlex.quote``), so a
sweep value holding ``$(...)``, backticks, ``;`` or newlines arrives in the job as the literal
string it was. The only text that is not quoted is what must be code: the sweep's ``setup``
lines (module loads and the like, written by the sweep's author as shell on purpose) and
integers. ``#SBATCH`` values are quoted too (sbatch reads shell-style quotes in directives) and
checked for newlines, which no quoting can make safe in a directive line.

One script serves one job or an array of jobs with the same resources: the task is chosen by
``SLURM_ARRAY_TASK_ID`` (0 when not an array), and its ``flm bench`` command line is set as the
positional parameters, never re-parsed by the shell. A packed script (``JobScript.packs``) runs
several tasks in one allocation instead, one ``srun`` step after another; the array index picks
the pack, and each step leaves its own exit status and log (contract.STEP_*).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment

from frontier_llm import __version__
from frontier_llm.errors import SpecError
from frontier_llm.jobs import contract, sbatch_values
from frontier_llm.jobs.launchers import RANK_TAIL, TRAINER_TAIL, LaunchJob, launcher_for
from frontier_llm.jobs.sbatch_options import long_form
from frontier_llm.jobs.workload import TRAINER_LOG
from frontier_llm.specs.site import Site, time_seconds

# Shipped templates are package data (frontier_llm/job_templates), read through importlib.resources.
TEMPLATE_PACKAGE = "frontier_llm"
TEMPLATE_FOLDER = "job_templates"
TEMPLATES = ("frontier", "nvidia", "local")

# Options each template understands (sweep key ``template_options``) and their defaults. What a
# site requires (modules, binding, launcher, communication settings) is in the system's
# ``site:`` section instead (frontier_llm.specs.site).
_COMMON_OPTIONS: dict[str, str | None] = {"master_port": str(contract.DEFAULT_MASTER_PORT)}
TEMPLATE_OPTIONS: dict[str, dict[str, str | None]] = {
    "frontier": {
        # The RCCL network plugin's lib folder, for a self-built plugin; by default the site's
        # rccl-net-plugin module provides it (OLCF PyTorch guide, "RCCL Network Plugin").
        "rccl_plugin_dir": None,
        "miopen_cache_root": "/tmp",
        # A packed Python environment (conda-pack .tar.gz) staged with sbcast to the site's
        # node-local storage before the ranks start (site.stage_dir; OLCF sbcast guide).
        "stage_env": None,
        **_COMMON_OPTIONS,
    },
    "nvidia": {
        "socket_ifname": None,
        "ib_hca": None,
        **_COMMON_OPTIONS,
    },
    "local": dict(_COMMON_OPTIONS),
}

_ENV_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")  # whole string: not "NAME\n"
_SAFE_NAME = re.compile(r"\A[A-Za-z0-9._-]+\Z")


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
        # Each value lands in an #SBATCH line: a conservative character set per option
        # (jobs/sbatch_values.py says why quoting is not enough there).
        for name in ("time", "account", "partition", "qos", "constraint", "mem"):
            sbatch_values.check(name, getattr(self, name))
        for opt in self.extra:
            _no_newline(opt, "extra_sbatch")
        # Short options (-S 8) in their long form: one #SBATCH word, one name for the rules;
        # then the long form's characters are checked like any other.
        object.__setattr__(self, "extra", tuple(long_form(o) for o in self.extra))
        for opt in self.extra:
            sbatch_values.check("extra_sbatch", opt)
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
    env: tuple[tuple[str, str], ...] = ()  # exported for this task only (e.g. per layout)
    # A trainer workload's task (jobs/workload.py): the command that turns the trainer's log
    # into the run's trace once it ends. Empty: the command is exec'd (flm bench).
    after: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _SAFE_NAME.match(self.key):
            raise SpecError(f"job key {self.key!r} may hold only letters, digits, '.', '_', '-'",
                            "key")
        for name, _ in self.env:
            if not _ENV_NAME.match(name):
                raise SpecError(
                    f"environment variable name {name!r} is not a valid shell name", "env")


@dataclass(frozen=True)
class JobScript:
    """Everything a template needs; rendering it has no other input.

    ``resources`` describes the ranks (tasks per node = ranks per node, CPUs per rank); the
    launcher reshapes the allocation where it needs to (torchrun: one task per node).
    ``modules`` None takes the site's list; an empty tuple loads none.
    """

    template: str  # a name in TEMPLATES or a path to a .sh.j2 file
    sweep: str
    job_name: str
    trace_dir: str
    log_pattern: str  # sbatch --output pattern (%A array job id, %a task index)
    resources: Resources
    tasks: tuple[Task, ...]
    modules: tuple[str, ...] | None = None
    env: tuple[tuple[str, str], ...] = ()
    # Names the job takes from the submitting shell (sbatch exports it); never their values.
    pass_env: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    options: Mapping[str, str | None] = field(default_factory=dict)
    command: tuple[str, ...] = ("flm", "bench")  # what runs each rank, before the task's args
    # The bin folder of the installation that rendered the script, put on PATH when the job's
    # environment has no ``flm`` (child.installation_bin); None leaves PATH as the job sets it.
    flm_bin: str | None = None
    site: Site = field(default_factory=Site)
    # Packed allocations: packs[i] lists the task indices array task i runs, in order, one srun
    # step each. Empty: one task per array index (task index = array index).
    packs: tuple[tuple[int, ...], ...] = ()
    # Set for concurrent packs: each step's ranks per node (the allocation holds all steps'),
    # and the steps run at once, each srun --exact taking only its own share.
    step_ranks_per_node: int | None = None
    # A trainer job: the signal its trainer saves a checkpoint and stops on (jobs/workload.py
    # exit_signal), sent to the ranks before the time limit instead of USR1 to the batch shell.
    trainer_signal: str | None = None
    # Lines said as comments at the top of the script (what the job needs installed).
    notes: tuple[str, ...] = ()
    # A trainer job's lead (jobs/signal_lead.py: long enough to save its checkpoint), in place
    # of the site's; None keeps the site's.
    signal_lead_s: int | None = None

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
        for name in self.pass_env:
            if not _ENV_NAME.match(name):
                raise SpecError(
                    f"environment variable name {name!r} is not a valid shell name", "pass_env")
        for line in self.setup:
            _no_newline(line, "setup")
        sbatch_values.check_path("log_pattern", self.log_pattern)
        sbatch_values.check("job_name", self.job_name)
        if self.packs:
            listed = sorted(i for p in self.packs for i in p)
            if not all(self.packs) or listed != sorted(t.index for t in self.tasks):
                raise SpecError("packs must list every task index exactly once", "pack")


def _no_newline(value: str | None, name: str) -> None:
    if value is not None and ("\n" in value or "\r" in value):
        raise SpecError(f"{name} must be one line (it holds a newline)", name)


def shell_quote(value: object) -> str:
    """The ``q`` filter: one shell word that is exactly ``str(value)``."""
    if isinstance(value, bool):
        value = "true" if value else "false"
    return shlex.quote(str(value))


def _shipped(name: str) -> str | None:
    """A shipped template's text (package data), or None for a name that is not shipped."""
    if "/" in name or not name.endswith(".sh.j2"):
        return None
    item = resources.files(TEMPLATE_PACKAGE).joinpath(TEMPLATE_FOLDER, name)
    return item.read_text() if item.is_file() else None


def _confined(folder: Path, name: str) -> Path | None:
    """``folder / name`` when it is a file inside ``folder`` once links are resolved; None
    otherwise. A template's parents and includes come from its own folder only: ``..``, an
    absolute name or a link that leads out would let a sweep read any file on the machine
    into its job script."""
    root = folder.resolve()
    if Path(name).is_absolute() or ".." in Path(name).parts:
        return None
    path = (root / name).resolve()
    if not path.is_file() or root not in path.parents:
        return None
    return path


def _local(folder: str):
    def load(name: str) -> str | None:
        path = _confined(Path(folder), name)
        return None if path is None else path.read_text()
    return load


# The largest script a template may produce. sbatch refuses a batch script larger than the
# controller's max_script_size (slurm.conf SchedulerParameters, default 4 MB:
# https://slurm.schedmd.com/slurm.conf.html#OPT_max_script_size), so nothing larger is a job
# script; the bound keeps a template's `'x' * 10**10` from taking the machine's memory.
MAX_SCRIPT_CHARS = 4 * 10**6
# The largest integer a template may compute by ``**``, in bits (a port, a byte count or a
# FLOP count needs under 100; 10**10**10 would take minutes and gigabytes).
_MAX_POWER_BITS = 4096
# A field width of eight digits or more in a format string ('%99999999s', '{:>99999999}'):
# each would allocate that many characters before any check could see the result.
_HUGE_WIDTH = re.compile(r"%[-#0 +]*\d{8,}|\{[^{}]*:[^{}]*?\d{8,}[^{}]*\}")


# The most loop iterations one render may run, all loops together: the shipped templates run a
# few hundred (one per rank or pack); each loop within the sandbox's range bound of 100,000
# could nest in another, and two of them ran 10**10 times, never stopped.
MAX_ITERATIONS = 1_000_000
_ITERATIONS: ContextVar[list[int] | None] = ContextVar("flm_template_iterations", default=None)
_COUNTED = "flm_counted_loop"  # the global every {% for %} iterates through (see _parse)


def _counted(iterable):
    """``iterable``, each item counted against the render's :data:`MAX_ITERATIONS`."""
    box = _ITERATIONS.get()
    for item in iterable:
        if box is not None:
            box[0] += 1
            if box[0] > MAX_ITERATIONS:
                raise SecurityError(f"loops that run more than {MAX_ITERATIONS:,} times in "
                                    "all (nested loops multiply)")
        yield item


def _too_big(what: str, size: int) -> SecurityError:
    return SecurityError(f"{what} would make {size:,} characters, more than a batch script "
                         f"may hold ({MAX_SCRIPT_CHARS:,}; slurm.conf max_script_size)")


def _check_repeat(seq: object, times: object) -> None:
    if (isinstance(seq, str | bytes | list | tuple) and isinstance(times, int)
            and len(seq) * times > MAX_SCRIPT_CHARS):
        raise _too_big("a repetition ('x' * n)", len(seq) * times)


def _check_width(fmt: object) -> None:
    if isinstance(fmt, str) and _HUGE_WIDTH.search(fmt):
        raise SecurityError("a format width of 8 digits or more: more than a batch script "
                            f"may hold ({MAX_SCRIPT_CHARS:,} characters)")


def _check_sizes(what: str, values) -> None:
    """Refuse an integer argument that, as a width or a count, passes a script's size."""
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_SCRIPT_CHARS:
            raise _too_big(f"{what}({value})", value)


class _BoundedSandbox(SandboxedEnvironment):
    """The sandbox with bounded cost: Jinja2's sandbox refuses unsafe attributes and calls but
    lets ``'x' * 10**10``, ``10**10**10`` and ``'%9999999999s' % x`` run (minutes, gigabytes)
    and answers ``range(10**9)`` with an OverflowError (a traceback). Here each of those is a
    SecurityError, which :func:`render` turns into one line; :func:`render` also stops a
    template whose output passes :data:`MAX_SCRIPT_CHARS` (a loop of large pieces)."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def _parse(self, source, name, filename):
        # Every loop iterates through _counted, so loops that nest are bounded together.
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Call(nodes.Name(_COUNTED, "load"), [loop.iter], [], None, None,
                                   lineno=loop.lineno)
        return tree

    def call_binop(self, context, operator: str, left, right):
        if operator == "*":
            _check_repeat(left, right)
            _check_repeat(right, left)
        elif operator == "**":
            if (isinstance(left, int) and isinstance(right, int) and abs(left) > 1
                    and right * abs(left).bit_length() > _MAX_POWER_BITS):
                raise SecurityError(f"a power ({left} ** {right}) of more than "
                                    f"{_MAX_POWER_BITS} bits")
        elif operator == "%" and isinstance(left, str):
            _check_width(left)
            if "*" in left:  # '%*s' % (10**10, 'x'): the width is an argument
                _check_sizes("a '%*' width", right if isinstance(right, tuple) else (right,))
        return super().call_binop(context, operator, left, right)

    def call(__self, __context, __obj, *args, **kwargs):
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str):
            # str.ljust/center/zfill/expandtabs(10**10) pad to their argument.
            _check_sizes(f"str.{getattr(__obj, '__name__', '?')}", (*args, *kwargs.values()))
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value):
        # str.format reaches the template as the sandbox's wrapper, made here: its widths
        # live in the string itself ('{:>9999999999}'), checked before it formats.
        # A width may also come from an argument ('{:>{w}}'.format('x', w=10**10)).
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        _check_width(value.__self__)

        def bounded(*args, **kwargs):
            _check_sizes("str.format", (*args, *kwargs.values(), *(
                args[0].values() if value.__name__ == "format_map" and args
                and isinstance(args[0], dict) else ())))
            return wrapped(*args, **kwargs)
        return bounded


def _bounded_filter(filt):
    """A padding filter (center, indent) that refuses a width beyond a script's size."""
    def bounded(value, width=None, *args, **kwargs):
        if isinstance(width, int) and width > MAX_SCRIPT_CHARS:
            raise _too_big(f"a width of {width}", width)
        return filt(value, *(() if width is None else (width,)), *args, **kwargs)
    return bounded


@lru_cache(maxsize=8)
def _environment(folder: str | None) -> jinja2.Environment:
    # Shipped names first, so "{% extends 'frontier.sh.j2' %}" always means the shipped one;
    # then the custom template's own folder for its own parents (nothing outside it).
    loaders: list[jinja2.BaseLoader] = [jinja2.FunctionLoader(_shipped)]
    if folder:
        loaders.append(jinja2.FunctionLoader(_local(folder)))
    # The sandbox: a template is rendered by `flm sweep render` and `submit --dry-run`, which
    # people run to *inspect* a colleague's sweep. A plain Environment lets a template reach
    # Python's os module through any global (cycler.__init__.__globals__) and run commands
    # right there; the sandbox refuses attributes that start with "_" and unsafe calls. What
    # the template *writes* is still shell that the job runs (docs/sweeps.md "Reviewing").
    env = _BoundedSandbox(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # shell, not HTML: quoting is the q filter's job
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = shell_quote
    env.globals[_COUNTED] = _counted
    for name in ("center", "indent"):  # their width argument pads: bounded like str.center
        env.filters[name] = _bounded_filter(env.filters[name])
    return env


def template_path(name: str, base: Path | None = None) -> Path:
    """The file behind a user's template path (relative to ``base``, the sweep's folder, and
    inside it: a sweep names its own templates, not any file of the machine)."""
    path = Path(name)
    if base is not None and not path.is_absolute():
        path = base / path
    if path.suffix != ".j2" or not path.is_file():
        raise SpecError(
            f"template must be one of {', '.join(TEMPLATES)} or a path to a .sh.j2 file "
            f"(got {name!r})", "template")
    path = path.resolve()
    if base is not None and base.resolve() not in path.parents:
        raise SpecError(f"template {name!r} lies outside the sweep file's folder "
                        f"{base.resolve()}; keep custom templates beside the sweep (or below "
                        "it)", "template")
    return path


def _parent(source: str, env: jinja2.Environment) -> str | None:
    """The template a source extends (a constant name), or None."""
    try:
        tree = env.parse(source)
    except jinja2.TemplateSyntaxError as exc:
        raise SpecError(f"template syntax error, line {exc.lineno}: {exc.message}",
                        "template") from None
    for node in tree.find_all(nodes.Extends):
        if isinstance(node.template, nodes.Const):
            return str(node.template.value)
    return None


def template_family(template: str) -> str | None:
    """The shipped template a template is, or extends (through its own parents); None for a
    custom template that extends none (its options are its own). A chain that comes back to
    a template already in it is refused: rendering it would recurse until Python gives up."""
    if template in TEMPLATES:
        return template
    path = template_path(template)
    env = _environment(str(path.parent))
    chain = [path.name]
    source = path.read_text()
    while True:
        parent = _parent(source, env)
        if parent is None:
            return None
        if parent.endswith(".sh.j2") and parent[:-len(".sh.j2")] in TEMPLATES:
            return parent[:-len(".sh.j2")]
        if parent == "_base.sh.j2":
            return "local"  # the skeleton: the common options only
        if parent in chain:
            raise SpecError(f"template {path.name} extends itself "
                            f"({' -> '.join([*chain, parent])}): a cycle", "template")
        chain.append(parent)
        nxt = _confined(path.parent, parent)
        if nxt is None:
            raise SpecError(f"template {path.name} extends {parent!r}, which is neither shipped "
                            f"({', '.join(t + '.sh.j2' for t in TEMPLATES)}) nor a file in its "
                            "own folder", "template")
        source = nxt.read_text()


def template_options(template: str) -> dict[str, str | None] | None:
    """The options (with defaults) a template accepts; None: any (a standalone template)."""
    family = template_family(template)
    return None if family is None else TEMPLATE_OPTIONS[family]


def signal_seconds(site: Site, limit: str) -> int | None:
    """Seconds before the time limit the batch shell gets USR1: the site's, but at most a tenth
    of a short job's time (a 5-minute job told at once would stop before its first step)."""
    if not site.signal_before_end_s:
        return None
    try:
        return max(1, min(site.signal_before_end_s, time_seconds(limit) // 10))
    except SpecError:  # UNLIMITED
        return site.signal_before_end_s


def render(job: JobScript) -> str:
    """The batch script text for ``job``: same input, same text (no clock, no host)."""
    if job.template in TEMPLATES:
        env = _environment(None)
        template = env.get_template(f"{job.template}.sh.j2")
    else:
        path = template_path(job.template)
        env = _environment(str(path.parent))
        template = env.from_string(path.read_text())
    known = template_options(job.template)
    options = {**_COMMON_OPTIONS, **(known or {}), **dict(job.options)}
    if known is not None:
        for k in job.options:
            if k not in known:
                raise SpecError(f"unknown template option '{k}' for {job.template} "
                                f"(valid: {', '.join(known)})", "template_options")
    port = str(options["master_port"])
    # isascii: "²".isdigit() is True, and int("²") is a ValueError.
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise SpecError("template_options.master_port must be a port number (1-65535)",
                        "template_options")
    top = contract.EPHEMERAL_LOW - contract.MIN_MASTER_PORT_SPAN
    if not 1024 <= int(port) <= top:
        raise SpecError(f"template_options.master_port must be 1024-{top}: the job's ports "
                        f"stay below the ephemeral range ({contract.EPHEMERAL_LOW}+)",
                        "template_options")
    site, r = job.site, job.resources
    trainer = any(t.after for t in job.tasks)
    whole = r.exclusive or r.partition not in site.shared_partitions
    launcher = launcher_for(LaunchJob(
        nodes=r.nodes, ranks_per_node=r.ntasks_per_node, gpus_per_node=r.gpus_per_node,
        cpus_per_task=r.cpus_per_task, command=job.command, site=site, overcommit=r.overcommit,
        tail=TRAINER_TAIL if trainer else RANK_TAIL, whole_node=whole))
    shape = launcher.sbatch_shape()
    launch = launcher.command()
    if job.step_ranks_per_node:
        step = job.step_ranks_per_node
        launch = launcher_for(LaunchJob(
            nodes=r.nodes, ranks_per_node=step, gpus_per_node=step if r.gpus_per_node else None,
            cpus_per_task=r.cpus_per_task, command=job.command, site=site,
            overcommit=r.overcommit, exact=True, whole_node=whole)).command()
    extra = r.extra
    if site.sbatch_network and not any(o.startswith("--network") for o in extra):
        extra = (f"--network={site.sbatch_network}", *extra)
    # site.sbatch_gpus false (Frontier): the allocation asks for nodes only, as OLCF's examples
    # do; each srun line asks for its own GPUs (a packed step inherits none to ask for all).
    sbatch = dataclasses.replace(r, ntasks_per_node=shape.ntasks_per_node,
                                 cpus_per_task=shape.cpus_per_task, extra=extra,
                                 gpus_per_node=r.gpus_per_node if site.sbatch_gpus else None)
    modules = (site.modules or ()) if job.modules is None else job.modules
    # NCCL_NET=OFI only when the job spans nodes: on one node the network plugin does not
    # initialize (OLCF PyTorch guide), so the choice is made here, where the node count is known.
    site_env = site.env + (site.env_multi_node if r.nodes > 1 else site.env_single_node)
    counter = _ITERATIONS.set([0])
    try:
        return _bounded_text(template.generate(
            job=job,
            r=sbatch,
            tasks=job.tasks,
            packs=job.packs,
            modules=modules,
            options=options,
            site=site,
            site_env=site_env,
            signal_s=job.signal_lead_s if trainer and job.signal_lead_s
            else signal_seconds(site, r.time),
            launch=launch,
            concurrent=job.step_ranks_per_node is not None,
            rank_cpus=r.cpus_per_task,
            # A node's CPUs, for a one-task-per-node set-up step (the staged untar).
            node_cpus=(sbatch.cpus_per_task or 1) * sbatch.ntasks_per_node,
            version=__version__,
            trainer=trainer,
            trainer_log=TRAINER_LOG,
            trainer_signal=job.trainer_signal if trainer else None,
            contract=contract.template_values(int(options["master_port"]),
                                              max((len(p) for p in job.packs), default=1)),
        ), job.template)
    except jinja2.UndefinedError as exc:
        raise SpecError(f"template {job.template}: {exc.message}", "template") from None
    except SecurityError as exc:
        raise SpecError(f"template {job.template}: refused by the template sandbox: {exc} "
                        "(templates may format values, not run Python)", "template") from None
    except jinja2.TemplateNotFound as exc:
        raise SpecError(f"template {job.template}: {exc.name!r} is neither shipped nor a file "
                        "in the template's own folder", "template") from None
    except jinja2.TemplateError as exc:
        raise SpecError(f"template {job.template}: {exc}", "template") from None
    except OverflowError as exc:
        # range(10**9) (the sandbox's own bound), 10.0 ** 1000: a number no script needs.
        raise SpecError(f"template {job.template}: refused by the template sandbox: {exc}",
                        "template") from None
    except RecursionError:
        # An include or macro that calls itself: one line, not a thousand frames.
        raise SpecError(f"template {job.template} includes or calls itself without end (a "
                        "cycle)", "template") from None
    finally:
        _ITERATIONS.reset(counter)


def _bounded_text(pieces, name: str) -> str:
    """The template's output, read piece by piece and refused once it passes
    :data:`MAX_SCRIPT_CHARS` (a loop of large pieces would otherwise fill the memory)."""
    out, size = [], 0
    for piece in pieces:
        size += len(piece)
        if size > MAX_SCRIPT_CHARS:
            raise SpecError(f"template {name}: refused by the template sandbox: its output "
                            f"passes {MAX_SCRIPT_CHARS:,} characters, more than a batch script "
                            "may hold (slurm.conf max_script_size)", "template")
        out.append(piece)
    return "".join(out)
