"""Sweep speed: render 10,000 layouts; submit 200 jobs as arrays to the local SLURM (held, then
cancelled); count the SLURM commands per poll for 20 and for 200 jobs.

Baselines, measured in the same run:
- rendering: one standalone batch script per job (what a hand-written generator does), against
  flm's one array script per group of jobs that share resources;
- submission: one ``sbatch --hold`` per job, against flm's arrays (which also record every job
  in the database);
- polling: the commands per poll must not grow with the number of jobs (issue 5).

The local SLURM comes from $SLURM_CONF when set, else one is started for the run with
scripts/slurm-cluster.sh (root, Debian's slurm-wlm) and stopped after.

    python benchmarks/bench_sweep.py [--layouts 10000] [--jobs 200]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from frontier_llm.jobs import runner  # noqa: E402
from frontier_llm.jobs.render import JobScript, Task, render  # noqa: E402
from frontier_llm.jobs.slurm import SlurmClient  # noqa: E402
from frontier_llm.jobs.sweepdir import job_scripts, render_sweep  # noqa: E402
from frontier_llm.jobs.sweepspec import load_sweep  # noqa: E402
from frontier_llm.store import open_store  # noqa: E402

BIG = """\
name: bench-render
model: gpt-175b
system: frontier
nodes: [8, 16, 32, 64, 128]
global_batch: 2048
space:
  auto: true
  fits_only: false
  top: {per_count}
resources:
  time: "01:00:00"
  account: BENCH1
"""

SMALL = """\
name: {name}
model: tiny-gpt
system: cpu-local
gpus_per_node: 4
dtype: fp32
steps: 2
warmup: 1
gpus: [1, 2, 4]
global_batch: 32
max_array_size: 1000
space:
  auto: true
  fits_only: false
  top: {per_count}
"""


def bench_render(n_layouts: int, work: Path) -> None:
    spec = work / "big.yaml"
    spec.write_text(BIG.format(per_count=n_layouts // 5))
    t0 = time.perf_counter()
    sweep = load_sweep(spec)
    t_expand = time.perf_counter() - t0
    t0 = time.perf_counter()
    manifest = render_sweep(sweep, work / "big")
    t_render = time.perf_counter() - t0

    # Baseline: a standalone script per job, each its own file.
    scripts = job_scripts(sweep, work / "base")
    (work / "base").mkdir()
    t0 = time.perf_counter()
    for _group, script in scripts:
        for task in script.tasks:
            one = JobScript(**{**script.__dict__, "tasks": (Task(0, task.key, task.argv),)})
            (work / "base" / f"{task.key}.sh").write_text(render(one))
    t_base = time.perf_counter() - t0
    n = len(manifest.jobs)
    print(f"render: {n} layouts expanded by the planner in {t_expand:.2f} s")
    print(f"render: {n} jobs -> {len(manifest.groups)} array scripts + manifest in "
          f"{t_render:.2f} s ({n / t_render:,.0f} jobs/s)")
    print(f"render baseline: one script per job, {n} files in {t_base:.2f} s "
          f"({n / t_base:,.0f} jobs/s); ratio baseline/flm = {t_base / t_render:.2f}")


def _sweep(work: Path, name: str, n_jobs: int):
    spec = work / f"{name}.yaml"
    spec.write_text(SMALL.format(name=name, per_count=n_jobs // 3 + 1))
    sweep = load_sweep(spec)
    keep = tuple(sweep.jobs[:n_jobs])
    assert len(keep) == n_jobs, f"only {len(sweep.jobs)} layouts"
    import dataclasses
    return dataclasses.replace(sweep, jobs=keep)


def bench_submit(n_jobs: int, work: Path, env: dict) -> None:
    client = SlurmClient(env)
    store = open_store(f"sqlite:///{work}/flm.db")
    polls = {}
    try:
        for n in (20, n_jobs):
            sweep = _sweep(work, f"bench-submit-{n}", n)
            session = runner.prepare(sweep, work / f"run{n}", store, client=client)
            before = client.commands.copy()
            t0 = time.perf_counter()
            runner.submit(session, hold=True)
            t_submit = time.perf_counter() - t0
            sbatch = (client.commands - before)["sbatch"]
            before = client.commands.copy()
            t0 = time.perf_counter()
            rows = runner.refresh(session)
            t_poll = time.perf_counter() - t0
            per_poll = sum((client.commands - before).values())
            polls[n] = per_poll
            assert all(r["state"] == "PENDING" for r in rows), {r["state"] for r in rows}
            print(f"submit: {n} jobs as {sbatch} held arrays (with database rows) in "
                  f"{t_submit:.2f} s; one poll of all {n}: {per_poll} SLURM command(s), "
                  f"{t_poll:.2f} s")
            runner.cancel(session)

        # Baseline: one held sbatch per job.
        script = work / "one.sh"
        script.write_text("#!/bin/bash\n#SBATCH --output=/dev/null\ntrue\n")
        ids = []
        t0 = time.perf_counter()
        for _ in range(n_jobs):
            ids.append(client.submit(script, hold=True))
        t_base = time.perf_counter() - t0
        client.cancel(ids)
        print(f"submit baseline: {n_jobs} single held sbatch calls in {t_base:.2f} s")
        print(f"polls: {polls[20]} command(s) for 20 jobs, {polls[n_jobs]} for {n_jobs} jobs "
              f"(constant: {polls[20] == polls[n_jobs]})")
    finally:
        store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=200)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="flm-bench-sweep-"))
    os.chmod(work, 0o755)
    started = None
    try:
        bench_render(args.layouts, work)
        env = dict(os.environ)
        if not env.get("SLURM_CONF"):
            started = work / "slurm"
            out = subprocess.run([str(REPO / "scripts" / "slurm-cluster.sh"), "start",
                                  str(started)], capture_output=True, text=True)
            if out.returncode != 0:
                print(f"no local SLURM ({out.stderr.strip()}); submission not measured")
                return 1
            env["SLURM_CONF"] = str(started / "slurm.conf")
        bench_submit(args.jobs, work, env)
    finally:
        if started is not None:
            subprocess.run([str(REPO / "scripts" / "slurm-cluster.sh"), "stop", str(started)])
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
