"""What one ``flm bench`` run is: its configuration, its run id, and its command line.

:func:`build_config` resolves model, system and layout from the command line and an optional
``--config`` YAML; :func:`bench_argv` is the one layout -> ``flm bench`` command line, used by the
local spawner (each rank re-runs it) and by sweep jobs (frontier_llm.jobs.sweepspec). Run ids:
:func:`new_run_id` for a local run, :func:`shared_run_id` for ranks started by a launcher, which
must all derive the same id without talking to each other.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from frontier_llm.errors import UserError
from frontier_llm.specs import axes
from frontier_llm.specs.layout import Layout, complete_layout, given_options, layout_argv
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec

# Keys of a --config file that are not layout fields.
CONFIG_BENCH_KEYS = ("model", "system", "steps", "warmup", "seed", "data", "memory_limit")
RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


@dataclass
class BenchConfig:
    model: ModelSpec
    system: SystemSpec
    layout: Layout
    steps: int = 10
    warmup: int = 2
    seed: int = 0
    trace_dir: str = "traces"
    run_id: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    memory_limit: int | None = None
    data: str | None = None
    fault: str | None = None
    fault_step: int = 0
    # Gradient all-reduce bucket of the DDP / ZeRO-1 paths (a run setting, not a layout knob).
    bucket_mb: float | None = None
    # FSDP2 reduce-scatters after every micro-batch (torchtitan's accumulation) rather than
    # only the last (specs/engine_rules.py GRAD_SYNC_EACH).
    grad_sync_each_microbatch: bool = False
    model_ref: str = ""  # the name or path given, for the spawned ranks' command line
    system_ref: str = ""


def parse_labels(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--label takes KEY=VALUE (got {item!r})")
        out[key] = value
    return out


def read_config_file(path: str | None) -> tuple[dict, dict]:
    """(layout fields, bench fields) from --config."""
    if path is None:
        return {}, {}
    from frontier_llm.specs.yamlio import load_yaml

    if not os.path.isfile(path):
        raise UserError(f"--config: {path} does not exist")
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise UserError(f"--config: {path} must hold a mapping of layout fields")
    data = dict(data)
    layout = dict(data.pop("layout", {}) or {})
    bench = {k: data.pop(k) for k in CONFIG_BENCH_KEYS if k in data}
    layout.update(data)
    return layout, bench


def build_config(args: Any) -> BenchConfig:
    """Resolve model, system and layout from parsed ``flm bench`` options (an argparse
    namespace); every error is a UserError naming the field."""
    from frontier_llm.bench.memlimit import parse_bytes
    from frontier_llm.catalog import load_model, load_system

    layout, bench = read_config_file(args.config)
    model_name = args.model or bench.get("model")
    if not model_name:
        raise UserError("--model is required (or a 'model' key in --config)")
    model = load_model(model_name)
    if model.is_mla:
        # bench/model.py builds grouped-query attention only; pricing MLA is the planner's.
        raise UserError(f"flm bench has no multi-head latent attention: {model.name} sets "
                        "kv_lora_rank (plan and export it; bench a model without MLA)")
    if model.mtp_layers:
        # bench/model.py builds no multi-token-prediction module; the cost model prices it.
        raise UserError(f"flm bench has no multi-token prediction: {model.name} sets "
                        f"mtp_layers {model.mtp_layers} (plan and export it to megatron-lm; "
                        "bench the model with mtp_layers 0)")
    system_ref = args.system or bench.get("system") or default_system()
    system = load_system(system_ref)
    given = given_options(args)
    if "zero" in given or "sharding" in given:
        # A flag overrides the file's sharding in whichever form the file gave it.
        layout.pop("zero", None)
        layout.pop("sharding", None)
    layout.update(given)
    layout.setdefault("dtype", "bf16")
    if "dp" not in layout and int(layout.get("ep", 1)) > 1:
        # ep re-folds the dp x cp ranks (specs/axes.py) and must divide them: with --ep and no
        # --dp, run the fewest data-parallel ranks it divides, so that
        # `flm bench --model tiny-moe --ep 2` runs on two ranks rather than refusing dp 1.
        layout["dp"] = axes.fewest_data_parallel_for_ep(int(layout["ep"]),
                                                        int(layout.get("cp", 1)))
    layout = Layout.from_dict(complete_layout(layout))
    limit = args.memory_limit or bench.get("memory_limit")

    def pick(name: str, default):
        value = getattr(args, name)
        return value if value is not None else bench.get(name, default)

    cfg = BenchConfig(
        model=model, system=system, layout=layout, steps=int(pick("steps", 10)),
        warmup=int(pick("warmup", 2)), seed=int(pick("seed", 0)), trace_dir=args.trace_dir,
        run_id=args.run_id or "", labels=parse_labels(args.label),
        memory_limit=parse_bytes(limit) if limit else None, data=pick("data", None),
        fault=args.fault, fault_step=args.fault_step, bucket_mb=args.bucket_mb,
        grad_sync_each_microbatch=bool(getattr(args, "grad_sync_each_microbatch", False)),
        model_ref=str(model_name), system_ref=str(system_ref),
    )
    if layout.dtype == "fp8":
        from frontier_llm.bench.float8 import check_device

        check_device(system.name, "fp8" in system.peak_flops)
    if cfg.bucket_mb is not None and cfg.bucket_mb <= 0:
        raise UserError("--bucket-mb must be above 0")
    if cfg.steps < 1 or cfg.warmup < 0:
        raise UserError("--steps must be at least 1 and --warmup at least 0")
    if cfg.run_id and not RUN_ID.fullmatch(cfg.run_id):
        raise UserError(f"--run-id may hold only letters, digits, '.', '_' and '-' "
                        f"(got {cfg.run_id!r})")
    return cfg


# Device files a GPU runtime opens (NVIDIA's driver; ROCm's kernel driver; CUDA under WSL):
# where none exists no GPU is visible, and the launcher need not import torch to learn it.
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def default_system(device_files: tuple[str, ...] = GPU_DEVICE_FILES) -> str:
    """The catalog system of this machine's GPU, ``cpu-local`` without one. On a machine with
    no GPU device file it answers without importing torch: the launcher of ``flm bench`` would
    otherwise spend seconds of CPU on it per run, beside ranks that import it anyway."""
    if not any(os.path.exists(f) for f in device_files):
        return "cpu-local"
    import torch

    if not torch.cuda.is_available():
        return "cpu-local"
    name = torch.cuda.get_device_name(0)
    # "GB200" before "B200", which it contains.
    for key, system in (("H100", "dgx-h100"), ("H200", "dgx-h200"), ("A100", "dgx-a100"),
                        ("MI250", "frontier"), ("GB200", "gb200-nvl72"), ("B200", "dgx-b200"),
                        ("MI300X", "mi300x"), ("MI325X", "mi325x"), ("MI355X", "mi355x")):
        if key in name:
            return system
    raise UserError(f"no catalog system for GPU {name!r}: pass --system")


def _degrees(lay: Layout) -> str:
    """``tp2pp1dp1`` (``tp2cp2pp1dp1ep2`` with context or expert parallelism: ids of layouts
    at cp 1 and ep 1 stay as they were)."""
    cp = f"cp{lay.cp}" if lay.cp > 1 else ""
    ep = f"ep{lay.ep}" if lay.ep > 1 else ""
    return f"tp{lay.tp}{cp}pp{lay.pp}dp{lay.dp}{ep}"


def new_run_id(cfg: BenchConfig) -> str:
    lay = cfg.layout
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (f"{cfg.model.name}-{_degrees(lay)}-{stamp}-"
            f"{uuid.uuid4().hex[:6]}")


def shared_run_id(cfg: BenchConfig, master_addr: str, master_port: int,
                  env: Mapping[str, str] = os.environ) -> str:
    """A run id every rank derives alike when none was given (from the launcher's job ids)."""
    job = (env.get("SLURM_JOB_ID", "") + "." + env.get("SLURM_STEP_ID", "")).strip(".")
    job = job or env.get("TORCHELASTIC_RUN_ID", "") or f"{master_addr}-{master_port}"
    lay = cfg.layout
    return re.sub(r"[^A-Za-z0-9._-]", "-",
                  f"{cfg.model.name}-{_degrees(lay)}-{job}")[:128]


def bench_argv(model_ref: str, system_ref: str, layout: Layout, *, steps: int, warmup: int,
               seed: int, labels: Mapping[str, str] = {}, extra: list[str] = ()) -> list[str]:
    """The ``flm bench`` arguments for one run: model, system, the layout (the one argv codec,
    :func:`~frontier_llm.specs.layout.layout_argv`), the run's length and its labels."""
    argv = ["--model", model_ref, "--system", system_ref, *layout_argv(layout),
            "--steps", str(steps), "--warmup", str(warmup), "--seed", str(seed)]
    for key, value in labels.items():
        argv += ["--label", f"{key}={value}"]
    return argv + list(extra)


def child_argv(cfg: BenchConfig, args: Any = None) -> list[str]:
    """The fully resolved command line each spawned rank runs (no --config, no defaults left)."""
    extra = ["--trace-dir", str(cfg.trace_dir), "--run-id", cfg.run_id]
    if cfg.memory_limit:
        extra += ["--memory-limit", str(cfg.memory_limit)]
    if cfg.data:
        extra += ["--data", str(cfg.data)]
    if cfg.fault:
        extra += ["--fault", cfg.fault, "--fault-step", str(cfg.fault_step)]
    if cfg.bucket_mb is not None:
        extra += ["--bucket-mb", str(cfg.bucket_mb)]
    if cfg.grad_sync_each_microbatch:
        extra += ["--grad-sync-each-microbatch"]
    return bench_argv(cfg.model_ref or cfg.model.name, cfg.system_ref or cfg.system.name,
                      cfg.layout, steps=cfg.steps, warmup=cfg.warmup, seed=cfg.seed,
                      labels=cfg.labels, extra=extra)
