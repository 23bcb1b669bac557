"""The per-rank main of ``flm bench``: set up, time the steps, gather, write the trace, tear down.

Timing: every step is bracketed by barriers (and a device synchronize on GPUs), so the recorded
time is the slowest rank's; warm-up steps are recorded but flagged and left out of the summary.
The saved-activation peak is measured with ``saved_tensors_hooks`` on the first step only (a
warm-up step when there is one), so the hooks' Python cost never lands in a measured step.

Failure handling: any exception on a rank is classified (out of memory or not) and written to a
small status file beside the trace; collectives carry a timeout, so the other ranks fail too
instead of hanging; rank 0 then writes a ``failed``/``oom`` trace naming the first error. Every
rank ends with ``os._exit`` (gloo's threads can abort a normal interpreter exit: machine-notes).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import resource
import signal
import socket
import statistics
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from frontier_llm import __version__
from frontier_llm.bench import deadline, placement
from frontier_llm.bench.config import BenchConfig
from frontier_llm.bench.engines import check as check_layout
from frontier_llm.bench.launch import RankEnv
from frontier_llm.bench.peer_errors import is_collateral
from frontier_llm.bench.record import prediction_fields, trace_record
from frontier_llm.bench.trace import heartbeat_path, trace_path, write_heartbeat, write_trace
from frontier_llm.bench.trace_moe import merge as merge_moe
from frontier_llm.bench.trace_moe import summary_fields as moe_summary
from frontier_llm.costmodel.flops import hardware_flops, model_flops
from frontier_llm.errors import ExitCode
from frontier_llm.specs import axes
from frontier_llm.specs.vocab import RunStatus

EXIT_OK, EXIT_FAILED, EXIT_OOM = ExitCode.OK, ExitCode.FAILED, ExitCode.OOM


def collective_timeout_s(world_size: int = 1) -> float:
    """Seconds a collective may wait for a peer before the rank gives up: FLM_COLLECTIVE_TIMEOUT,
    else 30 s growing by a fixed time per doubling of the ranks (bench.placement), so a hung or
    dead rank cannot hold a small run for long, a large one has time to set up its
    communicators, and a full-machine job's hang ends minutes, not hours, after it starts."""
    return placement.collective_timeout_s(world_size, os.environ)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _status_path(cfg: BenchConfig, rank: int) -> Path:
    return Path(cfg.trace_dir) / f".{cfg.run_id}.rank{rank}.status.json"


def versions() -> dict[str, str]:
    import numpy
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "numpy": numpy.__version__, "frontier_llm": __version__}
    if torch.cuda.is_available():
        out["cuda"] = str(torch.version.cuda or "")
        out["hip"] = str(getattr(torch.version, "hip", "") or "")
    return out


def skeleton_trace(cfg: BenchConfig, world_size: int, launcher: str, backend: str, device: str,
                   started_at: str, slurm_job_id: str | None = None) -> dict:
    """A trace with everything known before the run (status failed until it completes)."""
    return trace_record(
        cfg, run_id=cfg.run_id, status=RunStatus.FAILED.value, started_at=started_at,
        labels=cfg.labels,
        environment={
            "hostnames": [socket.gethostname()], "world_size": world_size, "backend": backend,
            "device": device, "launcher": launcher, "versions": versions(),
            "slurm_job_id": slurm_job_id or os.environ.get("SLURM_JOB_ID"),
        })


def prediction(cfg: BenchConfig) -> dict | None:
    """The cost model's figures for this layout (None where it has no answer)."""
    return prediction_fields(cfg)["prediction"]


def summarize(cfg: BenchConfig, steps: list[dict], memory: list[dict], world: int) -> dict:
    measured = [s["time_s"] for s in steps if not s["warmup"]]
    out = {"steps_measured": len(measured), "step_time_s": None, "step_time_mean_s": None,
           "step_time_std_s": None, "tokens_per_s": None, "model_tflops_per_gpu": None,
           "hardware_tflops_per_gpu": None, "mfu": None, "hfu": None,
           "peak_memory_bytes": None}
    peaks = [m["device_allocated_peak_bytes"] if m["device_allocated_peak_bytes"] is not None
             else sum(m[k] or 0 for k in ("params_bytes", "grads_bytes", "optimizer_bytes",
                                          "activations_peak_bytes"))
             for m in memory]
    out["peak_memory_bytes"] = max(peaks) if peaks else None
    if not measured:
        return out
    t = statistics.median(measured)
    # The global batch's tokens, once: cp ranks hold disjoint parts of the same sequences (and
    # tp ranks the same tokens), so neither multiplies them; per-GPU rates divide by the world
    # (tp x cp x pp x dp).
    tokens = cfg.layout.global_batch * cfg.model.seq_len
    model_tf = model_flops(cfg.model, tokens) / t / world / 1e12
    hw_tf = hardware_flops(cfg.model, tokens, cfg.layout.recompute,
                           cfg.layout.flash_attention) / t / world / 1e12
    peak = cfg.system.peak_flops.get(cfg.layout.dtype)
    out.update({
        "step_time_s": t, "step_time_mean_s": statistics.fmean(measured),
        "step_time_std_s": statistics.pstdev(measured), "tokens_per_s": tokens / t,
        "model_tflops_per_gpu": model_tf, "hardware_tflops_per_gpu": hw_tf,
        "mfu": model_tf * 1e12 / peak if peak else None,
        "hfu": hw_tf * 1e12 / peak if peak else None,
    })
    return out


def _first_error(cfg: BenchConfig, world: int, own: dict | None, wait_s: float = 5.0) -> dict:
    """The root cause among the ranks' status files (an OOM anywhere wins)."""
    deadline = time.monotonic() + wait_s
    found: dict[int, dict] = {}
    while True:
        for r in range(world):
            p = _status_path(cfg, r)
            if r not in found and p.exists():
                with contextlib.suppress(OSError, ValueError):
                    found[r] = json.loads(p.read_text())
        if len(found) == world or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    reports = sorted(found.items(), key=lambda kv: kv[1].get("time", 0.0))
    ooms = [r for r in reports if r[1].get("status") == RunStatus.OOM]
    # A collective error on a healthy rank is a symptom; prefer the rank that failed on its own.
    causes = ooms or [r for r in reports if not r[1].get("collateral")]
    if causes:
        rank, rep = causes[0]
        return {"status": rep["status"], "error": f"rank {rank}: {rep['error']}"}
    if reports:
        # Every report is a lost peer: a rank that left none (os._exit, a signal, a hang) is
        # the likelier cause; name it before the echo.
        rank, rep = reports[0]
        silent = [r for r in range(world) if r not in found]
        first = f"rank {silent[0]} left no report (crashed or hung?); " if silent else ""
        return {"status": rep["status"], "error": f"{first}rank {rank}: {rep['error']}"}
    return own or {"status": RunStatus.FAILED.value, "error": "a rank failed without a report"}


def _is_collateral(exc: BaseException) -> bool:
    return is_collateral(str(exc))


def _rss_peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class _Rank:
    """One rank's run: what setup resolved, and what the steps produced so far."""

    cfg: BenchConfig
    renv: RankEnv
    cuda: bool
    device: Any
    backend: str
    nccl_log: Path
    nodes: int
    trace: dict | None  # rank 0 only
    steps: list[dict] = field(default_factory=list)
    engine: Any = None
    deadline: deadline.Deadline | None = None
    stopped: str | None = None  # why the steps ended before the last (the job's time limit)

    @property
    def rank(self) -> int:
        return self.renv.rank

    @property
    def world(self) -> int:
        return self.renv.world_size


def run_rank(cfg: BenchConfig, renv: RankEnv) -> int:
    """Run this rank to the end; returns the exit code (0, 1, or 3 for out of memory)."""
    started = _now()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    check_layout(cfg.model, cfg.layout, renv.world_size)  # before any process group
    me = _setup(cfg, renv, started)
    signal.signal(signal.SIGTERM, _on_sigterm)
    me.deadline = deadline.for_rank(renv.rank)
    me.deadline.install()
    try:
        _start_engine(me)
        _timed_steps(me)
        _gather(me)
    except BaseException as exc:
        return _teardown(_record_failure(me, exc), clean=False)
    return _teardown(EXIT_FAILED if me.stopped else EXIT_OK, clean=True)


def _setup(cfg: BenchConfig, renv: RankEnv, started: str) -> _Rank:
    """Device, backend and (on rank 0) the trace skeleton; no process group yet."""
    import torch

    # The stage's output under TP is the local view of the logits; nothing writes to it in place
    # (the loss wraps it in a new DTensor), so FSDP2's warning about views does not apply.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    cuda = torch.cuda.is_available()
    nccl_log = Path(cfg.trace_dir) / f".{cfg.run_id}.nccl.log"
    if cuda:
        # The local rank modulo the devices this rank sees: one under --gpu-bind=closest, all of
        # the node's under CPU-mask binding or plain --gpus-per-node.
        index = placement.device_index(renv.local_rank, torch.cuda.device_count())
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
        backend, device_name = "nccl", torch.cuda.get_device_name(device)
        if renv.rank == 0 and "NCCL_DEBUG" not in os.environ:
            # Rank 0's INIT/NET log says which network the collectives use (OFI, IB, Socket).
            os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET",
                              NCCL_DEBUG_FILE=str(nccl_log))
    else:
        device, backend, device_name = torch.device("cpu"), "gloo", "cpu"
    trace = skeleton_trace(cfg, renv.world_size, renv.launcher, backend, device_name, started,
                           renv.slurm_job_id) if renv.rank == 0 else None
    nodes = placement.node_count(os.environ)
    if trace is not None:
        trace["environment"].update(
            nodes=nodes, binding=os.environ.get("FLM_BINDING", "none"),
            visible_devices=placement.visible_devices(os.environ),
            passed_env=placement.passed_env(os.environ),
            transport=placement.transport(backend, os.environ))
    Path(cfg.trace_dir).mkdir(parents=True, exist_ok=True)
    _status_path(cfg, renv.rank).unlink(missing_ok=True)
    return _Rank(cfg, renv, cuda, device, backend, nccl_log, nodes, trace)


def _rendezvous(addr: str, port: int, rank: int, world: int):
    """Rank 0's TCP store with every rank arrived, each waiting up to the rendezvous bound
    (placement.rendezvous_timeout_s), not the hang bound: a rank slow to import at scale is
    still coming. The last to arrive sets the key the others wait on."""
    import torch.distributed as dist

    wait = timedelta(seconds=placement.rendezvous_timeout_s(world, os.environ))
    store = dist.TCPStore(addr, int(port), world, is_master=rank == 0, timeout=wait,
                          wait_for_workers=False)
    if store.add("flm/arrived", 1) == world:
        store.set("flm/all-arrived", "1")
    store.wait(["flm/all-arrived"], wait)
    return store


def _start_engine(me: _Rank) -> None:
    """Join the process group (collectives time out: a dead peer fails this rank too), apply
    the memory limit and build the model on this rank."""
    import torch.distributed as dist

    from frontier_llm.bench.engines import create
    from frontier_llm.bench.memlimit import apply_limit

    cfg, renv = me.cfg, me.renv
    hang = timedelta(seconds=collective_timeout_s(me.world))
    store = _rendezvous(renv.master_addr, renv.master_port, me.rank, me.world)
    store.set_timeout(hang)  # from here on a missing peer is a hang
    dist.init_process_group(
        me.backend, store=store, rank=me.rank, world_size=me.world, timeout=hang,
        device_id=me.device if me.cuda else None,
    )
    if cfg.memory_limit:
        apply_limit(cfg.memory_limit)
    me.engine = create(cfg, renv, me.device)


def _timed_steps(me: _Rank) -> None:
    """Warm-up and measured steps, each bracketed by barriers (and a device synchronize)."""
    import torch
    import torch.distributed as dist

    cfg = me.cfg
    total = cfg.warmup + cfg.steps
    for step in range(total):
        me.stopped = _stop_reason(me)
        if me.stopped:
            me.stopped = f"stopped before step {step} of {total}: {me.stopped}"
            break
        if cfg.fault and step == cfg.fault_step and me.rank == me.world - 1:
            _inject(cfg.fault, me.rank, step)
        if me.cuda:
            torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        loss = me.engine.step(step, measure_activations=step == 0)
        if me.cuda:
            torch.cuda.synchronize()
        dist.barrier()
        elapsed = time.perf_counter() - t0
        me.steps.append({"step": step, "time_s": elapsed, "loss": loss,
                         "warmup": step < cfg.warmup})
        if me.rank == 0:
            write_heartbeat(cfg.trace_dir, cfg.run_id, step + 1, total, rank=me.rank)


def _stop_reason(me: _Rank) -> str | None:
    """Why the next step must not start (the job's end is too near), agreed by every rank: one
    all-reduce of the ranks' flags, so all stop before the same step."""
    import torch
    import torch.distributed as dist

    assert me.deadline is not None
    measured = [s["time_s"] for s in me.steps]
    predicted = ((me.trace or {}).get("prediction") or {}).get("step_time_s") or 0.0
    own = me.deadline.reason(max(measured) if measured else float(predicted))
    flag = torch.tensor([1 if own else 0], dtype=torch.int32, device=me.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if not int(flag.item()):
        return None
    return own or "another rank was told the job's time limit is near (SIGUSR1)"


def _gather(me: _Rank) -> None:
    """Every rank's record to rank 0, which writes the completed trace."""
    import torch.distributed as dist

    cfg, trace = me.cfg, me.trace
    record = _rank_record(me.engine, me.rank, me.steps, me.cuda)
    records: list = [None] * me.world
    dist.all_gather_object(records, record)
    if trace is not None:
        trace["steps"] = _merge_steps(records)
        trace["memory"] = [r["memory"] for r in records]
        trace["environment"]["hostnames"] = sorted({r["host"] for r in records})
        trace["summary"] = summarize(cfg, trace["steps"], trace["memory"], me.world)
        moe = merge_moe([r["moe"] for r in records], trace["steps"],
                        int(axes.shard_ranks(cfg.layout)),
                        [r["memory"]["tp_rank"] == 0 for r in records])
        if moe is not None:  # only a Mixture-of-Experts model's trace has these fields
            trace["moe"] = moe
            trace["summary"].update(moe_summary(moe))
        trace["status"], trace["finished_at"] = RunStatus.COMPLETED.value, _now()
        _judge_transport(trace, me.backend, me.nccl_log, me.nodes)
        if me.stopped:  # a valid trace of the steps done, not a run killed mid-step
            trace["status"], trace["error"] = RunStatus.TIMEOUT.value, me.stopped
        path = write_trace(cfg.trace_dir, trace)
        if me.renv.launcher != "local":  # the local spawner prints its own line
            print(summary_line(trace, path), flush=True)
    dist.barrier()


def _record_failure(me: _Rank, exc: BaseException) -> int:
    """Classify the exception, leave this rank's status file; rank 0 writes the failed trace
    naming the first error among the ranks. Returns the exit code."""
    from frontier_llm.bench.memlimit import is_oom
    from frontier_llm.bench.trace import write_json_atomic

    cfg = me.cfg
    oom = is_oom(exc)
    code = EXIT_OOM if oom else EXIT_FAILED
    text = str(exc).strip()
    status = (RunStatus.OOM if oom else RunStatus.TIMEOUT if isinstance(exc, Terminated)
              else RunStatus.FAILED).value
    own = {"status": status,
           "error": f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:2000],
           "collateral": _is_collateral(exc) and not oom, "time": time.time()}
    traceback.print_exc()
    with contextlib.suppress(OSError):
        write_json_atomic(_status_path(cfg, me.rank), own)
    trace = me.trace
    if trace is not None:
        try:
            cause = _first_error(cfg, me.world, own)
            trace["status"], trace["error"] = cause["status"], cause["error"]
            trace["finished_at"] = _now()
            trace["steps"] = list(me.steps)
            if me.engine is not None:
                trace["memory"] = [_rank_record(me.engine, me.rank, me.steps, me.cuda)["memory"]]
            trace["summary"] = summarize(cfg, trace["steps"], trace["memory"], me.world)
            write_trace(cfg.trace_dir, trace)
            code = EXIT_OOM if cause["status"] == RunStatus.OOM else EXIT_FAILED
        except Exception:
            traceback.print_exc()
    return code


class Terminated(Exception):
    """SIGTERM: SLURM's time limit (or a cancel) ending the job; recorded as status timeout."""


def _judge_transport(trace: dict, backend: str, nccl_log: Path, nodes: int) -> None:
    """Record the transport the collectives used; a multi-node run over sockets is suspect."""
    try:
        log = nccl_log.read_text(errors="replace")
    except OSError:
        log = ""
    used = placement.transport(backend, os.environ, log)
    trace["environment"]["transport"] = used
    if placement.is_suspect(used, nodes):
        trace["status"] = RunStatus.SUSPECT.value
        trace["error"] = (f"collectives of this {nodes}-node run went over TCP sockets (the "
                          "network plugin did not load?): not a clean measurement")


def _on_sigterm(signum, frame) -> None:
    raise Terminated("terminated by SIGTERM (job time limit or cancellation)")


def _inject(kind: str, rank: int, step: int) -> None:
    print(f"flm bench: injected {kind} on rank {rank} at step {step}", file=sys.stderr,
          flush=True)
    if kind == "crash":
        os._exit(EXIT_FAILED)  # a rank that dies without cleaning up
    while True:  # hang: never reach the next collective
        time.sleep(3600)


def _rank_record(engine, rank: int, steps: list[dict], cuda: bool) -> dict:
    import torch

    state = engine.state_bytes()
    c = engine.coords
    # Under context parallelism every cp rank's loss is the mean over its own (equally many)
    # tokens, so the mean over the loss ranks stays the global batch's mean.
    return {
        "host": socket.gethostname(),
        "losses": [s["loss"] for s in steps],
        "is_loss_rank": engine.has_last and c["tp"] == 0,
        "memory": {
            # Its index along every mesh axis, named by specs.axes (pp_stage, tp_rank, ...).
            "rank": rank, **axes.rank_fields(c),
            "params_bytes": state.params_bytes, "grads_bytes": state.grads_bytes,
            "optimizer_bytes": state.optimizer_bytes,
            "activations_peak_bytes": engine.activations_peak_bytes,
            "device_allocated_peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
            "device_reserved_peak_bytes": torch.cuda.max_memory_reserved() if cuda else None,
            "host_rss_peak_bytes": _rss_peak(),
        },
        "steps": steps,
        # What the MoE blocks did each step (bench/trace_moe.py); empty for a dense model and
        # for an engine without MoE blocks.
        "moe": list(getattr(engine, "moe_steps", [])),
    }


def _merge_steps(records: list[dict]) -> list[dict]:
    """Rank 0's timings (barrier-bracketed: every rank's are the same) with the mean loss over
    the data-parallel replicas of the last pipeline stage."""
    base = records[0]["steps"]
    loss_ranks = [r for r in records if r["is_loss_rank"]]
    out = []
    for i, s in enumerate(base):
        losses = [r["losses"][i] for r in loss_ranks if r["losses"][i] is not None]
        out.append({"step": s["step"], "time_s": s["time_s"],
                    "loss": statistics.fmean(losses) if losses else None,
                    "warmup": s["warmup"]})
    return out


def _teardown(code: int, clean: bool) -> int:
    """Barrier, destroy the process group, flush, os._exit (machine-notes: gloo exit aborts)."""
    import torch.distributed as dist

    try:
        if dist.is_initialized() and clean:
            dist.barrier()
            dist.destroy_process_group()
    except Exception:
        code = code or EXIT_FAILED
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def summary_line(trace: dict, path: Path) -> str:
    """The one JSON line ``flm bench`` prints for a finished run."""
    s, pred = trace["summary"], trace.get("prediction") or {}
    line = {"run_id": trace["run_id"], "status": trace["status"], "trace": str(path),
            "step_time_s": s["step_time_s"], "tokens_per_s": s["tokens_per_s"],
            "mfu": s["mfu"], "predicted_step_time_s": pred.get("step_time_s"),
            "peak_memory_bytes": s["peak_memory_bytes"]}
    # A Mixture-of-Experts run also says what its all-to-alls cost and how even the load was.
    line.update({k: s[k] for k in ("moe_dispatch_s", "moe_combine_s", "expert_imbalance")
                 if k in s})
    return json.dumps(line)


def write_launcher_failure(cfg: BenchConfig, world: int, codes: list[int], started: str) -> None:
    """The local spawner's fallback when rank 0 died before writing any trace."""
    if trace_path(cfg.trace_dir, cfg.run_id).exists():
        return
    trace = skeleton_trace(cfg, world, "local", "gloo", "cpu", started)
    oom = any(c == EXIT_OOM for c in codes)
    trace["status"] = (RunStatus.OOM if oom else RunStatus.FAILED).value
    cause = _first_error(cfg, world, None, wait_s=0.0)
    detail = cause["error"] if cause.get("error") else ""
    trace["error"] = f"ranks exited with codes {codes}" + (f"; {detail}" if detail else "")
    trace["finished_at"] = _now()
    write_trace(cfg.trace_dir, trace)


def cleanup_status_files(cfg: BenchConfig, world: int) -> None:
    for r in range(world):
        _status_path(cfg, r).unlink(missing_ok=True)


__all__ = ["BenchConfig", "heartbeat_path", "run_rank", "skeleton_trace"]
