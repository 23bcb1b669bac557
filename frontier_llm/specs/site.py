"""Site: what a machine's centre requires and recommends of a batch job, as data.

A system YAML's ``site:`` section holds it; a sweep's own ``site:`` section overrides any key.
Every value may be written as ``{value: ..., source: "..."}`` so the YAML says where each setting
comes from (the site's own documentation); :func:`site_from_mapping` keeps the sources apart in
``Site.sources``. docs/sites.md explains each shipped site.

An absent ``modules`` key (``None``) and an empty list differ: ``None`` inherits the site's list,
``[]`` loads nothing.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from frontier_llm.errors import SpecError

Launcher = Literal["srun", "torchrun", "mpiexec"]
Binding = Literal["closest", "cpu-masks", "none"]
TEMPLATE_FAMILIES = ("frontier", "nvidia", "local")

_TIME = re.compile(r"\A(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?\Z")
# The whole string (``\Z``: ``$`` also matches before a final newline).
_ENV_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")
# The site's groups of variables (docs/sites.md "env").
SITE_ENV_GROUPS = ("env", "env_multi_node", "env_single_node", "env_without_fsdp")


def time_seconds(text: str) -> int:
    """Seconds in a SLURM time limit: ``MM``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``."""
    m = _TIME.match(str(text))
    if not m:
        raise SpecError(f"not a SLURM time limit: {text!r}", "time")
    days, a, b, c = m.groups()
    if days is None and b is None:  # plain minutes
        return int(a) * 60
    if days is None and c is None:  # MM:SS
        return int(a) * 60 + int(b)
    h, mi, s = int(a), int(b or 0), int(c or 0)
    return int(days or 0) * 86400 + h * 3600 + mi * 60 + s


def format_time(seconds: int) -> str:
    """A SLURM time limit: ``HH:MM:SS``, or ``D-HH:MM:SS`` from a day on."""
    days, rest = divmod(int(seconds), 86400)
    hms = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{hms}" if days else hms


@dataclass(frozen=True)
class TimeBin:
    """Jobs of ``min_nodes``..``max_nodes`` nodes may ask for at most ``max_time``."""

    min_nodes: int
    max_nodes: int
    max_time: str

    def __post_init__(self) -> None:
        if not 1 <= self.min_nodes <= self.max_nodes:
            raise SpecError(f"time bin {self.min_nodes}-{self.max_nodes} is not a node range",
                            "time_bins")
        time_seconds(self.max_time)


@dataclass(frozen=True)
class QueueRule:
    """The limits of one partition or QoS (``kind``): jobs a user may have in it (any state),
    whether job arrays are allowed, the longest time and the largest job."""

    kind: Literal["qos", "partition"] = "qos"
    max_jobs: int | None = None
    arrays: bool = True
    max_time: str | None = None
    max_nodes: int | None = None
    # This queue's own line in the site's documentation (a refusal cites it, not the anchor of
    # another queue of the same section).
    source: str | None = None

    def __post_init__(self) -> None:
        if self.max_time is not None:
            time_seconds(self.max_time)


@dataclass(frozen=True)
class Site:
    """A site's batch-job requirements. ``template`` picks the shipped template family."""

    template: str = "local"
    launcher: Launcher = "srun"
    binding: Binding = "none"
    cpus_per_task: int | None = None
    cpu_masks: tuple[str, ...] = ()  # one hex mask per local rank (binding: cpu-masks)
    gpus: bool = True  # ask SLURM for GPUs (False: CPU ranks)
    # Ask for the GPUs in the allocation (#SBATCH --gpus-per-node) too, not only on srun. Off
    # where the site's examples ask for nodes only (Frontier): steps of a packed allocation
    # then cannot inherit the allocation's SLURM_GPUS_PER_NODE and ask for all of its GPUs.
    sbatch_gpus: bool = True
    overcommit: bool = False  # more ranks than cores (the local CPU cluster)
    partition: str | None = None
    qos: str | None = None
    # The names the site documents (empty: not checked); another is refused before sbatch.
    partitions: tuple[str, ...] = ()
    qos_names: tuple[str, ...] = ()
    account_required: bool = False
    account_pattern: str | None = None  # a regular expression the whole account must match
    # Modules that give RCCL/NCCL its network plugin; a multi-node job loading none of them
    # (and naming no plugin folder) is refused (empty: not checked).
    net_plugin_modules: tuple[str, ...] = ()
    # srun's task distribution and CPU binding for sites without CPU masks (DGX: block:block,
    # cores) so each rank's cores are its own and on its GPU's socket.
    distribution: str | None = None
    cpu_bind: str | None = None
    # srun/sbatch --threads-per-core: 1 makes -c count physical cores on nodes with SMT (DGX),
    # where a SLURM "CPU" is otherwise one hardware thread (half a core).
    threads_per_core: int | None = None
    # torchrun --numa-binding (launcher torchrun): each worker bound to its GPU's NUMA node.
    numa_binding: str | None = None
    # sbatch --signal=B:USR1@N: the batch shell is told N seconds before the time limit.
    signal_before_end_s: int | None = None
    # GB/s (1e9 bytes) a trainer job's checkpoint is written at: the parallel file system's
    # aggregate write bandwidth and one node's injection bandwidth (jobs/signal_lead.py: the
    # job's share is the smaller of the aggregate and nodes x the node's). None: the lead
    # stays the site's signal_before_end_s.
    checkpoint_write_gbps: float | None = None
    node_write_gbps: float | None = None
    mem: str | None = None
    exclusive: bool = False
    # Partitions whose nodes are shared between jobs (LUMI small-g, dev-g): a job there that
    # fills a node's GPUs asks for --exclusive, so the node's binding and memory are its own.
    shared_partitions: tuple[str, ...] = ()
    # A job smaller than a node in one of those partitions asks memory per GPU (sbatch
    # --mem-per-gpu), not the site's ``mem``: --mem=0 grants the node's whole memory, billed as
    # if the job held every GPU (LUMI: docs/sites.md "LUMI-G jobs smaller than a node").
    sub_node_mem_per_gpu: str | None = None
    # What a layout's flash attention needs installed on this site (ROCm: a ROCm build of PyTorch,
    # the flash-attn package built for the GPU), written as a comment into the scripts of jobs
    # whose layouts use it, with its source (docs/sites.md).
    flash_attention_prereq: str | None = None
    sbatch_network: str | None = None  # sbatch --network=...
    module_reset: bool = False
    module_paths: tuple[str, ...] = ()  # `module use` before the loads (LUMI AI factory modules)
    modules: tuple[str, ...] | None = None
    setup: tuple[str, ...] = ()  # shell lines after the modules (written as code, on purpose)
    env: tuple[tuple[str, str], ...] = ()
    env_multi_node: tuple[tuple[str, str], ...] = ()  # only for jobs of more than one node
    env_single_node: tuple[tuple[str, str], ...] = ()
    env_without_fsdp: tuple[tuple[str, str], ...] = ()  # only for layouts that do not shard params
    container_image: str | None = None  # pyxis srun --container-image
    container_mounts: str | None = None  # pyxis srun --container-mounts
    # Each rank runs inside `singularity run [-B bind]... IMAGE` (LUMI AI guide's container route).
    singularity_image: str | None = None
    singularity_binds: tuple[str, ...] = ()
    # Node-local storage a packed environment may be staged to with sbcast
    # (template_options.stage_env), and the constraint that gives a job that storage.
    # The site's parallel file systems (path prefixes): a sweep folder (--out) elsewhere is
    # warned about, since every rank reads the model files and writes its trace there.
    parallel_fs: tuple[str, ...] = ()
    stage_dir: str | None = None
    stage_constraint: str | None = None
    usable_cores_per_node: int | None = None
    max_queued_jobs: int | None = None
    time_bins: tuple[TimeBin, ...] = ()
    # The partitions the node-count bins govern (empty: every one); another partition has only
    # its own queue limits (Frontier: the bins are batch's, extended allows 24 h).
    time_bins_partitions: tuple[str, ...] = ()
    queues: tuple[tuple[str, QueueRule], ...] = ()
    sources: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.template not in TEMPLATE_FAMILIES:
            raise SpecError(f"site.template must be one of {', '.join(TEMPLATE_FAMILIES)} "
                            f"(got {self.template!r})", "template")
        if self.binding == "cpu-masks" and not self.cpu_masks:
            raise SpecError("site.binding cpu-masks needs site.cpu_masks", "cpu_masks")
        for mask in self.cpu_masks:
            if not re.fullmatch(r"0x[0-9a-fA-F]+", mask):
                raise SpecError(f"site.cpu_masks: {mask!r} is not a hex mask such as 0xfe",
                                "cpu_masks")
        for name in ("cpus_per_task", "usable_cores_per_node", "max_queued_jobs",
                     "signal_before_end_s", "threads_per_core"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise SpecError(f"site.{name} must be at least 1", name)
        if self.account_pattern is not None:
            try:
                re.compile(self.account_pattern)
            except re.error as exc:
                raise SpecError(f"site.account_pattern is not a regular expression: {exc}",
                                "account_pattern") from None
        for group in SITE_ENV_GROUPS:
            for k, _ in getattr(self, group):
                if not _ENV_NAME.match(k):
                    raise SpecError(f"site.{group}: {k!r} is not a valid variable name", group)

    def source(self, key: str) -> str:
        """Where the value of ``key`` comes from ("" when the YAML gives no source)."""
        return dict(self.sources).get(key, "")

    def queue(self, name: str | None, kind: str) -> QueueRule | None:
        for n, rule in self.queues:
            if n == name and rule.kind == kind:
                return rule
        return None

    def bins_apply(self, partition: str | None) -> bool:
        """Whether the node-count bins govern a job in ``partition`` (None: the site's)."""
        chosen = partition or self.partition
        return not self.time_bins_partitions or chosen in self.time_bins_partitions

    def time_bin(self, nodes: int) -> TimeBin | None:
        for b in self.time_bins:
            if b.min_nodes <= nodes <= b.max_nodes:
                return b
        return None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _env_pairs(value: Any, key: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise SpecError(f"site.{key} must map NAME: value", key)
    out = []
    for k, v in value.items():
        if isinstance(v, bool):
            v = "1" if v else "0"
        if not isinstance(v, str | int | float):
            raise SpecError(f"site.{key}.{k} must be a string or a number", key)
        out.append((str(k), str(v)))
    return tuple(out)


def _str_tuple(value: Any, key: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"site.{key} must be a list of strings", key)
    return tuple(value)


def split_sources(raw: Mapping) -> tuple[dict[str, Any], dict[str, str]]:
    """Values and their sources from a ``site:`` mapping (``{value:, source:}`` or plain)."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, item in raw.items():
        if isinstance(item, Mapping) and set(item) == {"value", "source"}:
            values[str(key)] = item["value"]
            sources[str(key)] = str(item["source"])
        else:
            values[str(key)] = item
    return values, sources


_STRINGS = ("partition", "qos", "mem", "sbatch_network", "container_image", "container_mounts",
            "account_pattern", "distribution", "cpu_bind", "singularity_image", "stage_dir",
            "stage_constraint", "numa_binding", "sub_node_mem_per_gpu",
            "flash_attention_prereq")
_FIELDS = {f.name for f in dataclasses.fields(Site)} - {"sources"}


def merge(base: Site | None, raw: Mapping | None) -> Site:
    """``base`` with the keys of the ``site:`` mapping ``raw`` replaced (a sweep's overrides).

    The ``env*`` mappings merge key by key (a sweep adds or replaces variables; an empty string
    value removes one); every other key replaces the site's value whole.
    """
    base = base or Site()
    if not raw:
        return base
    if not isinstance(raw, Mapping):
        raise SpecError("site must be a mapping of site settings", "site")
    values, sources = split_sources(raw)
    for key in values:
        if key not in _FIELDS:
            raise SpecError(f"unknown site key '{key}' (valid: {', '.join(sorted(_FIELDS))})",
                            "site")
    kw: dict[str, Any] = {}
    for key, value in values.items():
        if key.startswith("env"):
            merged = dict(getattr(base, key))
            for k, v in _env_pairs(value, key):
                if v == "":
                    merged.pop(k, None)
                else:
                    merged[k] = v
            kw[key] = tuple(merged.items())
        elif key == "modules":
            kw[key] = _str_tuple(value, key)
        elif key in ("cpu_masks", "setup", "time_bins_partitions", "partitions", "qos_names",
                     "net_plugin_modules", "module_paths", "singularity_binds", "parallel_fs",
                     "shared_partitions"):
            kw[key] = _str_tuple(value, key) or ()
        elif key == "time_bins":
            kw[key] = tuple(_time_bin(b) for b in (value or []))
        elif key == "queues":
            if not isinstance(value, Mapping):
                raise SpecError("site.queues must map a partition or QoS name to its limits",
                                "queues")
            kw[key] = tuple((str(n), _queue_rule(r, str(n))) for n, r in value.items())
        elif key in _STRINGS and isinstance(value, int) and not isinstance(value, bool):
            kw[key] = str(value)  # mem: 0 reads as a number
        else:
            kw[key] = value
    kw["sources"] = tuple({**dict(base.sources), **sources}.items())
    try:
        site = dataclasses.replace(base, **kw)
    except TypeError as exc:  # a value of the wrong kind reaching a comparison
        raise SpecError(f"site: {exc}", "site") from None
    _check_types(site)
    return site


def _time_bin(raw: Any) -> TimeBin:
    if not isinstance(raw, Mapping):
        raise SpecError("site.time_bins: each bin maps min_nodes, max_nodes, max_time",
                        "time_bins")
    try:
        return TimeBin(int(raw["min_nodes"]), int(raw["max_nodes"]), str(raw["max_time"]))
    except KeyError as exc:
        raise SpecError(f"site.time_bins: a bin lacks {exc.args[0]}", "time_bins") from None


def _queue_rule(raw: Any, name: str) -> QueueRule:
    if not isinstance(raw, Mapping):
        raise SpecError(f"site.queues.{name} must be a mapping of limits", "queues")
    unknown = set(raw) - {f.name for f in dataclasses.fields(QueueRule)}
    if unknown:
        raise SpecError(f"site.queues.{name}: unknown key {sorted(unknown)[0]!r}", "queues")
    return QueueRule(**dict(raw))


def _check_types(site: Site) -> None:
    for name in ("launcher", "binding"):
        allowed = {"launcher": ("srun", "torchrun", "mpiexec"),
                   "binding": ("closest", "cpu-masks", "none")}[name]
        if getattr(site, name) not in allowed:
            raise SpecError(f"site.{name} must be one of {', '.join(allowed)} "
                            f"(got {getattr(site, name)!r})", name)
    for name in ("gpus", "sbatch_gpus", "overcommit", "account_required", "exclusive",
                 "module_reset"):
        if not isinstance(getattr(site, name), bool):
            raise SpecError(f"site.{name} must be true or false", name)
    for name in ("cpus_per_task", "usable_cores_per_node", "max_queued_jobs",
                 "signal_before_end_s", "threads_per_core"):
        v = getattr(site, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise SpecError(f"site.{name} must be a whole number", name)
    for name in ("checkpoint_write_gbps", "node_write_gbps"):
        v = getattr(site, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or v <= 0):
            raise SpecError(f"site.{name} must be a positive number (GB/s)", name)
    for name in _STRINGS:
        v = getattr(site, name)
        if v is not None and not isinstance(v, str):
            raise SpecError(f"site.{name} must be a string", name)


def site_from_mapping(raw: Any) -> Site:
    """The ``site:`` section of a system YAML."""
    return merge(Site(), raw)


