"""SystemSpec: the accelerators of a machine and the links between them.

Each number that a calibration or a datasheet gave carries its source beside it in the YAML, so a
reader can tell a measured figure from a vendor's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from frontier_llm.errors import SpecError
from frontier_llm.specs.numbers import real
from frontier_llm.specs.site import Site
from frontier_llm.specs.values import check_name, finite

LinkScope = Literal["package", "node", "network"]
# The most GPUs one node exposes to the scheduler: today's densest nodes hold 8 (DGX H100,
# Frontier's 8 MI250X GCDs; NVIDIA DGX H100 user guide, OLCF Frontier user guide); 64 leaves
# room for a decade of denser nodes, while a typing mistake (80000) is refused instead of
# ranking plans no node can run.
MAX_GPUS_PER_NODE = 64
# Rates a device or link can have, with room both ways: below them a unit slipped (TFLOP/s or
# GB/s written as FLOP/s or B/s), and the cost model answered with step times of centuries.
# The slowest shipped device is cpu-local's 5e10 FLOP/s (a few CPU cores), its slowest link
# gloo over TCP at 1e9 B/s; the fastest an H100's 9.9e14 FLOP/s and NVLink's 4.5e11 B/s.
MIN_PEAK_FLOPS, MAX_PEAK_FLOPS = 1e8, 1e18
MIN_BANDWIDTH, MAX_BANDWIDTH = 1e6, 1e15
# A message start-up of an hour is no interconnect's; a fit on a busy machine gives seconds
# (flm quickstart's refit on a loaded 2-core host: 1.5 s), which must still load.
MAX_LATENCY_S = 3600.0
MIN_MEMORY_BYTES = 2**20  # a device of less than a MiB holds no layer of any model
_UNIT = "below it a unit slipped (TFLOP/s or GB/s written as FLOP/s or B/s)"


@dataclass(frozen=True)
class LinkTier:
    """One level of the interconnect, as seen by one GPU.

    ``scope``: ``package`` joins the dies of one package (an MI250X's two GCDs), ``node`` the GPUs
    of one node, ``network`` the nodes. ``bandwidth`` is bytes/s per GPU in each direction for a
    collective that spans this tier; ``latency`` is the per-message start-up time in seconds.
    ``rails`` (the network tier's): whether the collective library spreads a group's channels
    over the node's NICs, one per GPU, as NCCL does on a DGX (``costmodel/comm.py``
    ``link_for_span``); False where a communicator leaves the node through one NIC whatever
    its members per node (NCCL over Omni-Path on Jean Zay: BigScience's all-reduce log puts
    both ring channels on one HFI, ``planner/calibration.py`` ``with_stated_network``).
    """

    scope: LinkScope
    bandwidth: float
    latency: float
    source: str = ""
    rails: bool = True

    def __post_init__(self) -> None:
        if self.bandwidth <= 0:
            raise SpecError(f"links.{self.scope}.bandwidth must be positive", "bandwidth")
        if self.latency < 0:
            raise SpecError(f"links.{self.scope}.latency must not be negative", "latency")
        real(self.bandwidth, f"links.{self.scope}.bandwidth", lo=MIN_BANDWIDTH,
             hi=MAX_BANDWIDTH, reason=f"bytes/s; {_UNIT}")
        real(self.latency, f"links.{self.scope}.latency", lo=0, hi=MAX_LATENCY_S,
             reason="seconds per message")


# Efficiencies that scale a rate: zero would mean an infinite time.
RATE_EFFICIENCIES = ("matmul", "matmul_fp8", "memory", "collective")


@dataclass(frozen=True)
class Efficiency:
    """A fraction (0 <= value <= 1), with where it came from: an achievable share of a datasheet
    rate (``matmul``, ``memory``, ``collective``) or a share of communication hidden behind
    compute (``tp_overlap``). Data-parallel overlap is no knob: the engine's behaviour decides
    it (docs/costmodel.md)."""

    value: float
    source: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.value <= 1:
            raise SpecError(f"an efficiency must be in [0, 1] (got {self.value})", "value")


@dataclass(frozen=True)
class Power:
    """What a node draws while it trains, for energy estimates (docs/planner.md, "Planning an
    allocation"): ``device_w`` is one GPU's rated board power (as the scheduler counts GPUs: an
    MI250X GCD is half the package), ``host_w`` the rest of a node under load (CPUs, memory,
    NICs, fans), ``utilisation`` the share of ``device_w`` a GPU draws on average while
    training (an assumption, stated in ``source``). A node draws
    ``utilisation · gpus_per_node · device_w + host_w``."""

    device_w: float
    host_w: float
    utilisation: float
    source: str = ""

    def __post_init__(self) -> None:
        if not self.device_w > 0:
            raise SpecError("power.device_w must be positive", "device_w")
        if not self.host_w >= 0:
            raise SpecError("power.host_w must not be negative", "host_w")
        if not 0 < self.utilisation <= 1:
            raise SpecError(
                f"power.utilisation must be in (0, 1] (got {self.utilisation})", "utilisation"
            )

    def node_w(self, gpus_per_node: int) -> float:
        return self.utilisation * gpus_per_node * self.device_w + self.host_w


@dataclass(frozen=True)
class PredictionError:
    """The cost model's step-time error with this system's knobs on runs their fit did not see:
    ``log_residuals`` are log(predicted / measured step time), one per held-out run
    (``flm calibrate --from-runs`` writes its k-fold cross-validation's). The planner's
    intervals read them (planner/intervals.py)."""

    log_residuals: tuple[float, ...]
    method: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        values = tuple(float(x) for x in self.log_residuals)
        if not values:
            raise SpecError(
                "prediction_error.log_residuals needs at least one value", "log_residuals"
            )
        object.__setattr__(self, "log_residuals", values)


@dataclass(frozen=True)
class SystemSpec:
    """A homogeneous GPU system.

    ``gpus_per_node`` counts what the scheduler exposes as GPUs (Frontier: 8 GCDs per node, not 4
    MI250X packages); ``gpus_per_package`` groups them when dies share a package.
    ``peak_flops`` is dense FLOP/s per GPU for each dtype; ``memory_bytes`` is per GPU.
    ``efficiency`` holds the few fitted knobs the cost model reads (see docs/costmodel.md).
    """

    name: str
    gpu: str
    gpus_per_node: int
    memory_bytes: float
    peak_flops: dict[str, float]
    links: dict[str, LinkTier]
    efficiency: dict[str, Efficiency] = field(default_factory=dict)
    gpus_per_package: int = 1
    memory_bandwidth: float = 0.0  # bytes/s per GPU; used for the optimizer step
    # Device memory outside the model's tensors (costmodel/reserve.py): the CUDA/HIP context
    # (bytes), the collective library's channels per communicator (NCCL/RCCL; 0: gloo, no
    # device buffers), the caching allocator's fragmentation (reserved / allocated peak - 1),
    # and any further fixed reserve in bytes (0 in the catalog).
    memory_context_bytes: float = 0.0
    collective_channels: int = 0
    allocator_fragmentation: float = 0.0
    memory_reserved_bytes: float = 0.0
    # Fixed seconds per transformer block forward pass (backward counts twice): kernel launches
    # and synchronization that do not shrink with the block's size. Fitted (docs/costmodel.md).
    layer_overhead_s: float = 0.0
    # Matrix units reach the ``matmul`` efficiency only on large matrices: a GEMM runs at
    # matmul · d / (d + matmul_half_hidden), d its weight's smaller side on the rank (after the
    # TP split; costmodel/gemm.py). Fitted (docs/costmodel.md).
    matmul_half_hidden: float = 0.0
    description: str = ""
    sources: dict[str, str] = field(default_factory=dict)
    # One line: what the system's figures rest on (datasheets, a published measurement, a fit
    # to calibration rows, or assumptions), shown by ``flm systems``.
    rests_on: str = ""
    # GPUs joined by the ``node`` link tier (an NVLink switch domain) when it spans several
    # scheduler nodes: a GB200 NVL72 rack's 72 GPUs over its 18 four-GPU trays. 0: one node.
    # Collective groups inside it are priced at the node link's speed (costmodel/comm.py).
    scale_up_gpus: int = 0
    # What the centre requires of a batch job (partition, launcher, binding, modules, limits);
    # None: a plain SLURM cluster with no site rules (docs/sites.md).
    site: Site | None = None
    # Power per device and per node with its source, for energy estimates (None: not stated).
    power: Power | None = None
    # A calibration's own held-out error (None: the planner uses the calibration rows').
    prediction_error: PredictionError | None = None

    def __post_init__(self) -> None:
        check_name(self.name, "name")
        check_name(self.gpu, "gpu")
        if not 1 <= self.gpus_per_node <= MAX_GPUS_PER_NODE:
            raise SpecError(f"gpus_per_node must be between 1 and {MAX_GPUS_PER_NODE} "
                            f"(got {self.gpus_per_node})", "gpus_per_node")
        if self.gpus_per_package < 1 or self.gpus_per_node % self.gpus_per_package:
            raise SpecError(
                f"gpus_per_node ({self.gpus_per_node}) is not divisible by gpus_per_package "
                f"({self.gpus_per_package})",
                "gpus_per_package",
            )
        for name in ("memory_context_bytes", "memory_reserved_bytes", "collective_channels"):
            if finite(getattr(self, name), name) < 0:
                raise SpecError(f"{name} must not be negative", name)
        if not 0 <= finite(self.allocator_fragmentation, "allocator_fragmentation") < 1:
            raise SpecError("allocator_fragmentation is a share of the allocated peak, in [0, 1)",
                            "allocator_fragmentation")
        if self.memory_bytes <= 0:
            raise SpecError("memory_bytes must be positive", "memory_bytes")
        real(self.memory_bytes, "memory_bytes", lo=MIN_MEMORY_BYTES,
             reason="bytes per device: a MiB holds no layer of any model")
        if self.memory_bandwidth:  # 0: not stated
            real(self.memory_bandwidth, "memory_bandwidth", lo=MIN_BANDWIDTH, hi=MAX_BANDWIDTH,
                 reason=f"bytes/s per device; {_UNIT}")
        if not self.peak_flops:
            raise SpecError("peak_flops needs at least one dtype", "peak_flops")
        for dtype, value in self.peak_flops.items():
            finite(value, f"peak_flops.{dtype}")
            if value <= 0:
                raise SpecError(f"peak_flops.{dtype} must be positive", "peak_flops")
            real(value, f"peak_flops.{dtype}", lo=MIN_PEAK_FLOPS, hi=MAX_PEAK_FLOPS,
                 reason=f"FLOP/s per device; {_UNIT}")
        for needed in ("node", "network"):
            if needed not in self.links:
                raise SpecError(f"links needs a '{needed}' tier", "links")
        if self.scale_up_gpus and (self.scale_up_gpus < self.gpus_per_node
                                   or self.scale_up_gpus % self.gpus_per_node):
            raise SpecError(f"scale_up_gpus ({self.scale_up_gpus}) must be a multiple of "
                            f"gpus_per_node ({self.gpus_per_node})", "scale_up_gpus")
        for rate in RATE_EFFICIENCIES:
            if rate in self.efficiency and self.efficiency[rate].value <= 0:
                raise SpecError(f"efficiency.{rate} must be above 0", "efficiency")
        for scope, tier in self.links.items():
            if scope != tier.scope:
                raise SpecError(f"links.{scope} has scope '{tier.scope}'", "links")

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s per GPU for ``dtype``; 16-bit types fall back to each other."""
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        for alias in {"bf16": ("fp16",), "fp16": ("bf16",)}.get(dtype, ()):
            if alias in self.peak_flops:
                return self.peak_flops[alias]
        raise SpecError(
            f"system {self.name} has no peak for dtype {dtype} "
            f"(it has {', '.join(sorted(self.peak_flops))})",
            "dtype",
        )

    @property
    def scale_up_domain(self) -> int:
        """GPUs reachable over the ``node`` link: the NVLink domain, else one node."""
        return self.scale_up_gpus or self.gpus_per_node

    def eff(self, name: str, default: float = 1.0) -> float:
        e = self.efficiency.get(name)
        return e.value if e is not None else default

    def link(self, scope: str) -> LinkTier:
        if scope == "package" and "package" not in self.links:
            return self.links["node"]
        return self.links[scope]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
