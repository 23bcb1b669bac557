"""Start a ``flm bench`` run: join the ranks a launcher started, or start them here and report
what became of them."""

from __future__ import annotations

import sys
import time

from frontier_llm.bench.config import BenchConfig, child_argv, new_run_id
from frontier_llm.specs.vocab import RunStatus


def run_local(cfg: BenchConfig, world: int) -> int:
    """Spawn ``world`` local ranks running :func:`child_argv`; print the run's summary line (or
    its error on stderr) and return the bench exit status."""
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
    argv = child_argv(cfg)
    started = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    codes = spawn_local(argv, world)
    if any(codes):
        write_launcher_failure(cfg, world, codes, started)
    cleanup_status_files(cfg, world)
    path = trace_path(cfg.trace_dir, cfg.run_id)
    if not path.exists():
        print(f"flm bench: no trace was written ({codes})", file=sys.stderr)
        return EXIT_FAILED
    trace = read_trace(path)
    status = trace["status"]
    if status != RunStatus.COMPLETED:
        print(f"flm bench: run {cfg.run_id} {status}: {trace['error']} (trace: {path})",
              file=sys.stderr)
    else:
        print(summary_line(trace, path))
    # A suspect run ran to the end (its trace is stored flagged), so it is not a failure.
    return {RunStatus.COMPLETED: EXIT_OK, RunStatus.SUSPECT: EXIT_OK,
            RunStatus.OOM: EXIT_OOM}.get(status, EXIT_FAILED)


def run(cfg: BenchConfig, nproc: int | None = None) -> int:
    """The whole of ``flm bench`` once configured: join the launcher's ranks, or start
    ``nproc`` (default tp x cp x pp x dp) local ones. The layout is checked before any process
    starts."""
    from frontier_llm.bench.config import shared_run_id
    from frontier_llm.bench.engines import check as check_layout
    from frontier_llm.bench.launch import detect

    renv = detect()
    world = renv.world_size if renv else (nproc or cfg.layout.world_size)
    check_layout(cfg.model, cfg.layout, world)  # refused here: no process has started
    if renv is not None:
        from frontier_llm.bench.run import run_rank

        if not cfg.run_id:
            cfg.run_id = shared_run_id(cfg, renv.master_addr, renv.master_port)
        return run_rank(cfg, renv)
    return run_local(cfg, world)
