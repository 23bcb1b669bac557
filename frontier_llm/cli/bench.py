"""flm bench: run the distributed GPT training benchmark for one layout and write its trace."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import uuid

from frontier_llm.cli.common import add_command
from frontier_llm.cli.layout_args import add_layout_args, parse_sharding
from frontier_llm.errors import UserError

LAYOUT_DESTS = ("tp", "pp", "dp", "micro_batch", "global_batch", "schedule", "virtual_stages",
                "sequence_parallel", "recompute", "zero", "sharding", "flash_attention", "dtype")
CONFIG_BENCH_KEYS = ("model", "system", "steps", "warmup", "seed", "data", "memory_limit")


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "bench", "run the distributed training benchmark for one layout",
        "Train a GPT with PyTorch-native tensor, pipeline and (sharded) data parallelism for a "
        "few steps and write <trace-dir>/<run-id>.trace.json: per-step times and losses, "
        "per-rank memory, tokens/s, TFLOP/s and MFU, beside the cost model's prediction.\n\n"
        "Inside torchrun, srun or mpiexec it joins the job's ranks; otherwise it starts --nproc "
        "local ranks itself (default tp x pp x dp). Exit status: 0 completed, 3 out of memory, "
        "1 other failure, 2 bad input (refused before any process starts).",
        [
            "flm bench --model tiny-gpt --tp 2 --dp 2 --dtype fp32 --steps 5",
            "flm bench --model tiny-gpt-8l --pp 2 --virtual-stages 2 --micro-batch 1 "
            "--global-batch 4 --dtype fp32",
            "flm bench --model tiny-gpt --dp 4 --zero 3 --global-batch 8 --trace-dir traces",
            "flm bench --config layout.yaml --trace-dir traces --label sweep=demo",
            "srun -n 8 flm bench --model gpt3-1.3b --system dgx-h100 --tp 2 --dp 4 "
            "--global-batch 64",
        ],
    )
    p.add_argument("--model", default=None, help="catalog model name or model YAML path")
    p.add_argument("--system", default=None,
                   help="catalog system or YAML path (default: cpu-local without a GPU)")
    p.add_argument("--config", default=None, metavar="layout.yaml",
                   help="YAML with layout fields (and optionally model, system, steps, ...); "
                        "flags given on the command line override it")
    add_layout_args(p, required=False)
    # None means "not given", so --config values are only overridden by explicit flags.
    p.set_defaults(**{d: None for d in LAYOUT_DESTS})
    r = p.add_argument_group("run")
    r.add_argument("--steps", type=int, default=None, help="measured steps (default 10)")
    r.add_argument("--warmup", type=int, default=None,
                   help="warm-up steps, recorded but not measured (default 2)")
    r.add_argument("--seed", type=int, default=None, help="weights and data seed (default 0)")
    r.add_argument("--trace-dir", default="traces", help="where the trace goes (default traces)")
    r.add_argument("--run-id", default=None, help="trace name (default: generated)")
    r.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="tag the trace (repeatable); sweeps set sweep=NAME and job_key=KEY")
    r.add_argument("--memory-limit", default=None, metavar="SIZE",
                   help="per-rank memory limit (e.g. 512M); exceeding it ends in an oom trace")
    r.add_argument("--data", default=None, metavar="tokens.bin",
                   help="memory-mapped token file (uint16 ids, uint32 above 65536 tokens) "
                        "instead of synthetic tokens")
    r.add_argument("--bucket-mb", type=float, default=None, metavar="MB",
                   help="gradient all-reduce bucket of the DDP and ZeRO-1 paths in MiB "
                        "(default 64; a run setting flm tune can search)")
    r.add_argument("--nproc", type=int, default=None,
                   help="local ranks to start when not inside a launcher (default tp x pp x dp)")
    r.add_argument("--fault", choices=("crash", "hang"), default=None,
                   help="inject a failure on the last rank (tests of failure handling)")
    r.add_argument("--fault-step", type=int, default=0, help="step of the injected fault")
    p.set_defaults(func=run)


def _labels(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--label takes KEY=VALUE (got {item!r})")
        out[key] = value
    return out


def _config_file(path: str | None) -> tuple[dict, dict]:
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


def build_config(args: argparse.Namespace):
    """Resolve model, system and layout; every error is a UserError naming the field."""
    from frontier_llm.bench.memlimit import parse_bytes
    from frontier_llm.bench.run import BenchConfig
    from frontier_llm.catalog import load_model, load_system
    from frontier_llm.specs.parallel import ParallelConfig, zero_preset

    layout, bench = _config_file(args.config)
    model_name = args.model or bench.get("model")
    if not model_name:
        raise UserError("--model is required (or a 'model' key in --config)")
    model = load_model(model_name)
    system_ref = args.system or bench.get("system") or _default_system()
    system = load_system(system_ref)
    given = {d: getattr(args, d) for d in LAYOUT_DESTS if getattr(args, d) is not None}
    if "zero" in given:
        layout.pop("zero", None)
        layout["sharding"] = zero_preset(given.pop("zero"))
    if "sharding" in given:
        layout.pop("zero", None)
        layout["sharding"] = parse_sharding(given.pop("sharding"))
    layout.update(given)
    layout.setdefault("tp", 1)
    layout.setdefault("dtype", "bf16")
    layout.setdefault("global_batch", layout.get("micro_batch", 1) * layout.get("dp", 1))
    if "schedule" not in layout and layout.get("virtual_stages", 1) > 1:
        layout["schedule"] = "interleaved"
    layout = ParallelConfig.from_dict(layout)
    limit = args.memory_limit or bench.get("memory_limit")

    def pick(name: str, default):
        value = getattr(args, name)
        return value if value is not None else bench.get(name, default)

    cfg = BenchConfig(
        model=model, system=system, layout=layout, steps=int(pick("steps", 10)),
        warmup=int(pick("warmup", 2)), seed=int(pick("seed", 0)), trace_dir=args.trace_dir,
        run_id=args.run_id or "", labels=_labels(args.label),
        memory_limit=parse_bytes(limit) if limit else None, data=pick("data", None),
        fault=args.fault, fault_step=args.fault_step,
        bucket_mb=args.bucket_mb, model_ref=str(model_name),
        system_ref=str(system_ref),
    )
    if cfg.bucket_mb is not None and cfg.bucket_mb <= 0:
        raise UserError("--bucket-mb must be above 0")
    if cfg.steps < 1 or cfg.warmup < 0:
        raise UserError("--steps must be at least 1 and --warmup at least 0")
    if cfg.run_id and not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", cfg.run_id):
        raise UserError(f"--run-id may hold only letters, digits, '.', '_' and '-' "
                        f"(got {cfg.run_id!r})")
    return cfg


def _default_system() -> str:
    import torch

    if not torch.cuda.is_available():
        return "cpu-local"
    name = torch.cuda.get_device_name(0)
    for key, system in (("H100", "dgx-h100"), ("H200", "dgx-h100"), ("A100", "dgx-a100"),
                        ("MI250", "frontier")):
        if key in name:
            return system
    raise UserError(f"no catalog system for GPU {name!r}: pass --system")


def new_run_id(cfg) -> str:
    lay = cfg.layout
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (f"{cfg.model.name}-tp{lay.tp}pp{lay.pp}dp{lay.dp}-{stamp}-"
            f"{uuid.uuid4().hex[:6]}")


def run(args: argparse.Namespace) -> int:
    from frontier_llm.bench.launch import detect
    from frontier_llm.bench.mesh import check_layout

    cfg = build_config(args)
    renv = detect()
    world = renv.world_size if renv else (args.nproc or cfg.layout.world_size)
    check_layout(cfg.model, cfg.layout, world)  # refused here: no process has started
    if renv is not None:
        from frontier_llm.bench.run import run_rank

        if not cfg.run_id:
            cfg.run_id = _shared_run_id(cfg, renv)
        return run_rank(cfg, renv)
    return _run_local(cfg, args, world)


def _shared_run_id(cfg, renv) -> str:
    """A run id every rank derives alike when none was given (from the launcher's job ids)."""
    env = os.environ
    job = (env.get("SLURM_JOB_ID", "") + "." + env.get("SLURM_STEP_ID", "")).strip(".")
    job = job or env.get("TORCHELASTIC_RUN_ID", "") or f"{renv.master_addr}-{renv.master_port}"
    lay = cfg.layout
    return re.sub(r"[^A-Za-z0-9._-]", "-",
                  f"{cfg.model.name}-tp{lay.tp}pp{lay.pp}dp{lay.dp}-{job}")[:128]


def child_argv(cfg, args: argparse.Namespace) -> list[str]:
    """The fully resolved command line each spawned rank runs (no --config, no defaults left)."""
    lay = cfg.layout
    argv = [
        "--model", cfg.model_ref or cfg.model.name, "--system", cfg.system_ref or cfg.system.name,
        "--tp", str(lay.tp), "--pp", str(lay.pp), "--dp", str(lay.dp),
        "--micro-batch", str(lay.micro_batch), "--global-batch", str(lay.global_batch),
        "--schedule", lay.schedule, "--virtual-stages", str(lay.virtual_stages),
        "--recompute", lay.recompute, "--dtype", lay.dtype,
        "--sharding", ",".join(f"{k[0]}={getattr(lay.sharding, k)}"
                               for k in ("params", "grads", "optim")),
        "--steps", str(cfg.steps), "--warmup", str(cfg.warmup), "--seed", str(cfg.seed),
        "--trace-dir", str(cfg.trace_dir), "--run-id", cfg.run_id,
    ]
    if lay.sequence_parallel:
        argv.append("--sequence-parallel")
    if not lay.flash_attention:
        argv.append("--no-flash-attention")
    for key, value in cfg.labels.items():
        argv += ["--label", f"{key}={value}"]
    if cfg.memory_limit:
        argv += ["--memory-limit", str(cfg.memory_limit)]
    if cfg.data:
        argv += ["--data", str(cfg.data)]
    if cfg.fault:
        argv += ["--fault", cfg.fault, "--fault-step", str(cfg.fault_step)]
    return argv


def _run_local(cfg, args: argparse.Namespace, world: int) -> int:
    from frontier_llm.bench.launch import spawn_local
    from frontier_llm.bench.run import (
        EXIT_FAILED,
        EXIT_OK,
        EXIT_OOM,
        cleanup_status_files,
        summary_line,
        write_launcher_failure,
    )
    from frontier_llm.bench.trace import read_trace, trace_path

    if not cfg.run_id:
        cfg.run_id = new_run_id(cfg)
    argv = child_argv(cfg, args)
    started = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    codes = spawn_local(argv, world)
    write_launcher_failure(cfg, world, codes, started) if any(codes) else None
    cleanup_status_files(cfg, world)
    path = trace_path(cfg.trace_dir, cfg.run_id)
    if not path.exists():
        print(f"flm bench: no trace was written ({codes})", file=sys.stderr)
        return EXIT_FAILED
    trace = read_trace(path)
    status = trace["status"]
    if status != "completed":
        print(f"flm bench: run {cfg.run_id} {status}: {trace['error']} (trace: {path})",
              file=sys.stderr)
    else:
        print(summary_line(trace, path))
    # A suspect run ran to the end (its trace is stored flagged), so it is not a failure.
    return {"completed": EXIT_OK, "suspect": EXIT_OK, "oom": EXIT_OOM}.get(status, EXIT_FAILED)
