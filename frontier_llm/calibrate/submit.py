"""``flm calibrate submit``: the microbenchmark as a SLURM job, from the system's job template.

The batch script is rendered by :func:`frontier_llm.jobs.render.render` (the same templates,
launchers and ``site:`` rules as a sweep's jobs): one task whose rank command is
``python -m frontier_llm.cli calibrate worker ...``, started by the site's launcher (srun,
torchrun or mpiexec) on ``--nodes`` nodes. The site's rules are checked before the script is
written. Rank 0 writes ``DIR/results/<run id>.calibration.json``; ``flm calibrate fit`` (or
``--wait`` here) turns it into a system YAML.
"""

from __future__ import annotations

from pathlib import Path

from frontier_llm.child import flm
from frontier_llm.jobs.render import JobScript, Resources, Task
from frontier_llm.specs.site import Site
from frontier_llm.specs.system import SystemSpec

KEY = "calibrate"
CPU_RANKS_PER_NODE = 2  # a CPU site has no GPU count to default to


def job_script(system: SystemSpec, nodes: int, ranks_per_node: int, worker_argv: list[str],
               directory: Path, time_limit: str, account: str | None,
               partition: str | None) -> tuple[JobScript, Resources]:
    """The calibration job's JobScript (pure)."""
    site = system.site or Site()
    resources = Resources(
        nodes=nodes, ntasks_per_node=ranks_per_node, cpus_per_task=site.cpus_per_task,
        gpus_per_node=ranks_per_node if site.gpus else None, time=time_limit, account=account,
        partition=partition or site.partition, qos=site.qos, mem=site.mem,
        exclusive=site.exclusive, overcommit=site.overcommit)
    job = JobScript(
        template=site.template, sweep=KEY, job_name=f"flm-calibrate-{system.name}"[:64],
        trace_dir=str(directory / "results"), log_pattern=str(directory / "logs" / "%j.out"),
        resources=resources, tasks=(Task(index=0, key=KEY, argv=tuple(worker_argv)),),
        command=tuple(flm(["calibrate", "worker"])), site=site)
    return job, resources


def results_path(directory: Path, job_id: str) -> Path:
    """Where rank 0 of job ``job_id`` writes (the template's run id is KEY-j<job id>)."""
    return directory / "results" / f"{KEY}-j{job_id}.calibration.json"
