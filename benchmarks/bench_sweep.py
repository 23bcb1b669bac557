"""Sweep speed: render 10,000 Frontier layouts (packed to obey Frontier's queue limit); submit
200 jobs as arrays to the local SLURM (held, then cancelled); count the SLURM commands per poll
for 20 and for 200 jobs.

Baselines, measured in the same run:
- rendering: one standalone batch script per layout (what a hand-written generator does), against
  flm's one array script per group of jobs that share resources;
- submission: one ``sbatch --hold`` per job, against flm's arrays (which also record every job
  in the database);
- polling: the commands per poll must not grow with the number of jobs (issue 5).

Why the rendered sweep is packed: Frontier lets a user queue at most 100 jobs, each array task
counting (site rule ``max_queued_jobs``, docs/sites.md), and ``flm sweep render`` refuses a sweep
over it before writing anything. 10,000 layouts can reach Frontier only as packed allocations
(``pack: N``, N layouts as srun steps of one array task, docs/sweeps.md "Packing small layouts"),
so the benchmark renders the sweep a user would submit: the pack size is the smallest that keeps
every node count's layouts within the limit, and each layout's time the longest that keeps a
packed allocation within the time bin of its node count (both read from the site's rules, so the
benchmark follows them if they change). This keeps the 10,000-layout scale and Frontier's
template, times the site check that the real render runs, and exercises the packed scripts;
turning the rule off or rendering a site without it would time a sweep no Frontier user can
render. The one-script-per-layout baseline times writing only (each script with its layout's
own time, no packing); submitted as is it would break the same rule.

The local SLURM comes from $SLURM_CONF when set, else one is started for the run with
scripts/slurm-cluster.sh (root, Debian's slurm-wlm) and stopped after.

    python benchmarks/bench_sweep.py [--layouts 10000] [--jobs 200]
    python benchmarks/bench_sweep.py --quick   # 500 layouts, 40 jobs: seconds (tests run it)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from frontier_llm.catalog import load_system  # noqa: E402
from frontier_llm.jobs import runner  # noqa: E402
from frontier_llm.jobs.render import Task, render  # noqa: E402
from frontier_llm.jobs.slurm import SlurmClient  # noqa: E402
from frontier_llm.jobs.sweepdir import format_time, job_scripts, render_sweep  # noqa: E402
from frontier_llm.jobs.sweepspec import load_sweep  # noqa: E402
from frontier_llm.specs.site import time_seconds  # noqa: E402
from frontier_llm.store import open_store  # noqa: E402

NODES = (8, 16, 32, 64, 128)
BIG = """\
name: bench-render
model: gpt-175b
system: frontier
nodes: [{nodes}]
global_batch: 2048
pack: {pack}
space:
  auto: true
  fits_only: false
  top: {per_count}
resources:
  time: "{time}"
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


def frontier_packing(per_count: int) -> tuple[int, str, int | None]:
    """Pack size and time per layout that keep ``per_count`` layouts at each node count of
    NODES within Frontier's rules, and the queue limit: each node count gets an equal share of
    ``max_queued_jobs`` array tasks, and a packed allocation (pack x time) fits the shortest
    time bin of those node counts."""
    site = load_system("frontier").site
    if site.max_queued_jobs is None:
        return 1, "01:00:00", None
    share = site.max_queued_jobs // len(NODES)
    pack = -(-per_count // share)
    bins = [site.time_bin(n) for n in NODES]
    longest = min(time_seconds(b.max_time) for b in bins if b is not None)
    minutes = min(60, longest // pack // 60)
    if minutes < 1:
        sys.exit(f"{per_count} layouts per node count need packs of {pack}, which leave under "
                 "a minute per layout in Frontier's time bins: ask for fewer --layouts")
    return pack, format_time(minutes * 60), site.max_queued_jobs


def bench_render(n_layouts: int, work: Path) -> None:
    spec = work / "big.yaml"
    per_count = n_layouts // len(NODES)
    pack, layout_time, queued = frontier_packing(per_count)
    spec.write_text(BIG.format(nodes=", ".join(map(str, NODES)), pack=pack,
                               per_count=per_count, time=layout_time))
    t0 = time.perf_counter()
    sweep = load_sweep(spec)
    t_expand = time.perf_counter() - t0
    t0 = time.perf_counter()
    # What is timed is rendering: the layouts' one-minute slots are a packing exercise, not
    # what a 175B step takes, so the walltime check (jobs/walltime.py) is told to let them be.
    manifest = render_sweep(sweep, work / "big", allow_overtime=True)
    t_render = time.perf_counter() - t0

    # Baseline: a standalone script per layout, each its own file with the layout's own time
    # (no array, no packing).
    scripts = job_scripts(sweep, work / "base")
    (work / "base").mkdir()
    t0 = time.perf_counter()
    for _group, script in scripts:
        alone = dataclasses.replace(script.resources, time=layout_time)
        for task in script.tasks:
            one = dataclasses.replace(script, tasks=(Task(0, task.key, task.argv, task.env),),
                                      packs=(), resources=alone)
            (work / "base" / f"{task.key}.sh").write_text(render(one))
    t_base = time.perf_counter() - t0
    n = len(manifest.jobs)
    array_tasks = len({(j["group"], j["index"]) for j in manifest.jobs})
    limit = f"Frontier queues at most {queued}" if queued else "no queue limit"
    print(f"render: {n} layouts expanded by the planner in {t_expand:.2f} s")
    print(f"render: {n} jobs -> {len(manifest.groups)} array scripts of {array_tasks} array "
          f"tasks in all, {pack} layouts of {layout_time} per task ({limit}) + manifest in "
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
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layouts", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--quick", action="store_true",
                    help="the same code at a tiny size (500 layouts, 40 jobs; seconds): what "
                         "tests/test_benchmarks.py runs")
    args = ap.parse_args()
    if args.quick:
        args.layouts, args.jobs = 500, 40
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
