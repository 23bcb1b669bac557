"""A sweep's folder: batch scripts, a manifest, logs and traces, all inside one directory.

    DIR/manifest.json          every job: key, script, array index, layout, bench argv, prediction
    DIR/sweep.yaml             the sweep file as it was when rendered
    DIR/inputs/                the model/system files the sweep names by path (the ranks
                               read these copies, not the rendering machine's checkout)
    DIR/scripts/<group>.sh     one script per group of jobs that share resources (a job array;
                               with ``pack: N`` each array task runs up to N of them in turn)
    DIR/logs/<group>/          SLURM output, one file per task and attempt (%a-%A.out)
    DIR/traces/                what flm bench writes (<run-id>.trace.json, .heartbeat.json)

Every path is built from the sweep's own safe names and checked to stay inside DIR.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import secrets
import shutil
import socket
import textwrap
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from frontier_llm import __version__
from frontier_llm.atomic import write_text_atomic
from frontier_llm.child import installation_bin
from frontier_llm.errors import UserError
from frontier_llm.jobs import signal_lead, site_policy, unsafe, walltime
from frontier_llm.jobs.render import JobScript, Resources, Task, render, signal_seconds
from frontier_llm.jobs.render_warnings import (
    command_paths,
    out_warning,
    pack_warnings,
    staging_warning,
    sub_node_warnings,
)
from frontier_llm.jobs.sweepspec import Sweep, SweepJob
from frontier_llm.jobs.workload import (
    FLM_BENCH,
    config_files,
    exit_signal,
    rank_command,
    steps_in_command,
    trainer_argv,
)
from frontier_llm.jobs.workload import (
    task_env as trainer_task_env,
)
from frontier_llm.specs.engine_rules import rules_for
from frontier_llm.specs.identity import layout_hash
from frontier_llm.specs.layout import PlacementKind
from frontier_llm.specs.site import format_time, time_seconds

MANIFEST = "manifest.json"
# Held (flock) by the command that submits the sweep's jobs; holds who, for the message.
LOCK_FILE = ".flm-submit.lock"


@dataclass(frozen=True)
class Group:
    name: str
    script: str  # path relative to the sweep folder
    nodes: int
    ranks_per_node: int
    time: str  # the allocation's: a packed one holds its layouts' times end to end
    keys: tuple[str, ...]
    pack: int = 1  # layouts per allocation (array task), one srun step each
    concurrent: bool = False  # the steps run at once, side by side on the allocation's node

    @property
    def log_dir(self) -> str:
        return f"logs/{self.name}"

    @property
    def packs(self) -> tuple[tuple[int, ...], ...]:
        """The positions in ``keys`` that each array task runs (one each without packing)."""
        n = len(self.keys)
        return tuple(tuple(range(i, min(i + self.pack, n))) for i in range(0, n, self.pack))

    def array_index(self, position: int) -> int:
        """The array task that runs the layout at ``position`` in ``keys``."""
        return position // self.pack


@dataclass(frozen=True)
class Manifest:
    """What ``render_sweep`` wrote; the executors and the job tracker work from it."""

    directory: Path
    data: dict[str, Any]

    @property
    def sweep(self) -> str:
        return self.data["sweep"]

    @property
    def jobs(self) -> list[dict[str, Any]]:
        return self.data["jobs"]

    @property
    def groups(self) -> list[dict[str, Any]]:
        return self.data["groups"]

    @property
    def env(self) -> dict[str, str]:
        """The sweep's ``environment.env`` (``sweep_env``); {} in a folder rendered before the
        manifest held it."""
        return dict(self.data.get("env") or [])

    @property
    def pass_env(self) -> tuple[str, ...]:
        """The names of ``environment.pass_env``: variables the jobs take from the shell that
        submits them (their values are written nowhere)."""
        return tuple(self.data.get("pass_env") or ())

    @property
    def trace_dir(self) -> Path:
        return self.directory / "traces"

    def job(self, key: str) -> dict[str, Any]:
        for j in self.jobs:
            if j["key"] == key:
                return j
        raise UserError(f"no job {key!r} in sweep {self.sweep}")

    def group(self, name: str) -> dict[str, Any]:
        for g in self.groups:
            if g["name"] == name:
                return g
        raise UserError(f"no group {name!r} in sweep {self.sweep}")

    def path(self, relative: str) -> Path:
        return inside(self.directory, relative)


def inside(root: Path, relative: str | os.PathLike) -> Path:
    """``root / relative``, refusing anything that would land outside ``root``."""
    root = root.resolve()
    path = (root / relative).resolve()
    if path != root and root not in path.parents:
        raise UserError(f"path {relative!s} leaves the sweep folder {root}")
    return path


def group_jobs(sweep: Sweep) -> list[Group]:
    """Jobs with the same nodes, ranks per node and time limit share a job array (chunked to
    the sweep's max_array_size array tasks), in the order the sweep lists them. With ``pack: N``
    each array task runs up to N of them in turn, so it asks for N times their time."""
    buckets: dict[tuple[int, int, str], list[SweepJob]] = {}
    for job in sweep.jobs:
        buckets.setdefault((job.nodes, job.ranks_per_node, job.time), []).append(job)
    groups = []
    concurrent = sweep.spec.pack_mode == "concurrent"
    for (nodes, rpn, time), jobs in buckets.items():
        pack = sweep.spec.pack
        if concurrent:
            # Side by side only where they fit: one node, N x its ranks within the node's
            # devices. The node's, not the sweep's gpus_per_node: a sweep of one-GCD layouts
            # written as nodes: [1] + gpus_per_node: 1 still has 8 GCDs per Frontier node.
            pack = 1 if nodes > 1 else max(1, min(pack, node_slots(sweep) // rpn))
        size = sweep.spec.max_array_size * pack
        for start in range(0, len(jobs), size):
            chunk = jobs[start:start + size]
            name = f"g{len(groups):03d}-n{nodes}x{rpn}"
            per = min(pack, len(chunk))
            # In turn: the allocation holds the layouts' times end to end; side by side: one's.
            sequential = per > 1 and not concurrent
            groups.append(Group(name=name, script=f"scripts/{name}.sh", nodes=nodes,
                                ranks_per_node=rpn,
                                time=format_time(per * time_seconds(time)) if sequential else time,
                                keys=tuple(j.key for j in chunk), pack=per,
                                concurrent=concurrent and per > 1))
    return groups


def node_slots(sweep: Sweep) -> int:
    """Ranks one node can hold side by side: its GPUs (the system's, one rank each); for CPU
    ranks the sweep's ranks per node (the slots it lays layouts out on)."""
    return sweep.system.gpus_per_node if sweep.site.gpus else sweep.per_node


def _resources(sweep: Sweep, group: Group) -> Resources:
    """The ranks' resources: the sweep's ``resources:`` first, then the site's defaults."""
    r, site = sweep.spec.resources, sweep.site
    pick = lambda mine, sites: mine if mine is not None else sites  # noqa: E731
    # Concurrent steps share the allocation: it holds every step's ranks at once.
    ranks = group.ranks_per_node * (group.pack if group.concurrent else 1)
    partition = pick(r.partition, site.partition)
    # A job filling a node's GPUs in a partition whose nodes are shared (LUMI small-g, dev-g)
    # asks for the node whole: its binding and memory then are its own (site.shared_partitions).
    fills = site.gpus and ranks >= sweep.system.gpus_per_node
    exclusive = r.exclusive or site.exclusive or (fills and partition in site.shared_partitions)
    mem, extra = pick(r.mem, site.mem), tuple(r.extra_sbatch or ())
    if site.gpus and partition in site.shared_partitions and not exclusive and r.mem is None:
        # Smaller than a node where nodes are shared (LUMI small-g, dev-g): the site's --mem=0
        # is the node's whole memory, and LUMI bills those partitions by the largest of GCDs,
        # 8-core and 64 GB slices (lumi-userguide docs/runjobs/lumi_env/billing.md, "GPU
        # billing"): a 1-GCD job paid 8 and held the node. Memory per GPU instead, as the LUMI
        # AI guide's small-g scripts ask it (01-quickstart/run.sh: --mem-per-gpu=60G).
        mem = None
        if site.sub_node_mem_per_gpu and not any(o.startswith("--mem") for o in extra):
            extra = (f"--mem-per-gpu={site.sub_node_mem_per_gpu}", *extra)
    return Resources(
        nodes=group.nodes, ntasks_per_node=ranks,
        cpus_per_task=pick(r.cpus_per_task, site.cpus_per_task),
        gpus_per_node=ranks if site.gpus else None, time=group.time,
        account=r.account, partition=partition,
        qos=pick(r.qos, site.qos), constraint=r.constraint, mem=mem,
        exclusive=exclusive, overcommit=site.overcommit, extra=extra,
    )


def _task_env(sweep: Sweep, job: SweepJob,
              directory: Path | None = None) -> tuple[tuple[str, str], ...]:
    """Variables for one task: the site's ``env_without_fsdp`` for layouts whose engine
    overlaps TP communication and that do not shard parameters (NVIDIA:
    CUDA_DEVICE_MAX_CONNECTIONS=1 must not be set with FSDP); for a trainer job, what the
    trainer requires on every site and the job's folder (jobs/workload.py task_env)."""
    if sweep.spec.workload != FLM_BENCH:
        return trainer_task_env(sweep.spec.workload, job.model, job.layout,
                                str(job_dir((directory or Path(".")).resolve(), job.key)))
    fsdp = job.layout.sharding.params.kind != PlacementKind.REPLICATE and job.layout.dp > 1
    # CUDA_DEVICE_MAX_CONNECTIONS=1 (one hardware queue) orders kernels so TP communication
    # can overlap GEMMs; it also stops other streams' kernels running concurrently, a cost with
    # no gain for an engine that does not overlap TP communication (flm bench's do not).
    overlap = job.layout.tp > 1 and rules_for(job.layout.engine).tp_comm_overlap
    return sweep.site.env_without_fsdp if overlap and not fsdp else ()


def input_files(sweep: Sweep, directory: Path) -> dict[str, str]:
    """The model and system files a sweep names by path, each mapped to its copy in the sweep
    folder (``inputs/``). The ranks read the copy: the path on the rendering machine is a
    checkout (on Frontier, NFS home), not the parallel file system the folder is on, and it
    may change before the job runs. Catalog names are not files: they stay names."""
    refs = [j.model_ref for j in sweep.jobs] + [sweep.system_ref]
    out: dict[str, str] = {}
    for ref in refs:
        if ref in out or not Path(ref).is_absolute():
            continue
        name = Path(ref).name
        taken = set(out.values())
        copy = inside(directory, f"inputs/{name}")
        n = 1
        while str(copy) in taken:
            n += 1
            copy = inside(directory, f"inputs/{Path(name).stem}-{n}{Path(name).suffix}")
        out[ref] = str(copy)
    return out


def _moved(argv: tuple[str, ...], moves: dict[str, str]) -> tuple[str, ...]:
    return tuple(moves.get(w, w) for w in argv)


def signal_leads(sweep: Sweep) -> dict[str, signal_lead.Lead]:
    """Each trainer job's pre-deadline signal lead (jobs/signal_lead.py); none for flm bench
    or a trainer without an exit signal (those keep the batch shell's USR1 at the site's)."""
    if sweep.spec.workload == FLM_BENCH or not exit_signal(sweep.spec.workload):
        return {}
    out = {}
    for job in sweep.jobs:
        try:
            limit_s: int | None = time_seconds(job.time)
        except UserError:  # UNLIMITED
            limit_s = None
        found = signal_lead.lead(signal_seconds(sweep.site, job.time), sweep.site, job.model,
                                 job.layout, job.nodes, job.prediction.get("step_time_s"),
                                 limit_s)
        if found is not None:
            out[job.key] = found
    return out


def _attention_notes(sweep: Sweep, jobs: Sequence[SweepJob]) -> tuple[str, ...]:
    """The site's flash-attention prerequisites, for a script whose layouts ask for flash
    attention (the trainers' flash flags and flm bench's SDPA kernel need them installed)."""
    prereq = sweep.site.flash_attention_prereq
    if not prereq or not any(j.layout.flash_attention for j in jobs):
        return ()
    source = sweep.site.source("flash_attention_prereq")
    text = (f"Flash attention on {sweep.system.name}: {prereq}"
            + (f" (source: {source})" if source else ""))
    # Comment lines of a readable width; a URL is never broken.
    return tuple(textwrap.wrap(text, 96, break_long_words=False, break_on_hyphens=False))


def job_scripts(sweep: Sweep, directory: Path) -> list[tuple[Group, JobScript]]:
    """The JobScript of every group (pure: no file is touched)."""
    directory = directory.resolve()
    leads = signal_leads(sweep)
    moves = input_files(sweep, directory)
    by_key = {j.key: j for j in sweep.jobs}
    env = sweep.spec.environment
    out = []
    for group in group_jobs(sweep):
        tasks = tuple(Task(index=i, key=k,
                           argv=_moved(task_argv(sweep, by_key[k], directory), moves),
                           env=_task_env(sweep, by_key[k], directory),
                           after=_moved(by_key[k].after, moves))
                      for i, k in enumerate(group.keys))
        out.append((group, JobScript(
            packs=group.packs if group.pack > 1 else (),
            step_ranks_per_node=group.ranks_per_node if group.concurrent else None,
            template=sweep.template,
            sweep=sweep.name,
            job_name=f"flm-{sweep.name}-{group.name}",
            trace_dir=str(inside(directory, "traces")),
            log_pattern=str(inside(directory, group.log_dir)) + "/%a-%A.out",
            resources=_resources(sweep, group),
            tasks=tasks,
            modules=None if env.modules is None else tuple(env.modules),
            env=sweep_env(sweep),
            pass_env=tuple(env.pass_env or ()),
            setup=tuple(env.setup or ()),
            options={k: None if v is None else str(v)
                     for k, v in (sweep.spec.template_options or {}).items()},
            command=rank_command(sweep.spec.workload, _workload_command(sweep, directory)[0],
                                 sweep.site)
            if sweep.spec.workload_command else tuple(sweep.spec.command or ("flm", "bench")),
            flm_bin=installation_bin(),
            site=sweep.site,
            trainer_signal=None if sweep.spec.workload == FLM_BENCH
            else exit_signal(sweep.spec.workload),
            notes=_attention_notes(sweep, [by_key[k] for k in group.keys]),
            # One signal per allocation: a pack's is its largest checkpoint's.
            signal_lead_s=max((leads[k].seconds for k in group.keys if k in leads),
                              default=None),
        )))
    return out


def _workload_command(sweep: Sweep, directory: Path) -> tuple[tuple[str, ...], list[str]]:
    """The trainer's command with its relative file paths checked (render_warnings)."""
    return command_paths(sweep.spec.workload_command or (), directory.resolve(),
                         Path(sweep.source).resolve().parent)


def job_dir(directory: Path, key: str) -> Path:
    """A trainer job's own folder: the config files its flags name (jobs/workload.py)."""
    return inside(directory, f"jobs/{key}")


def task_argv(sweep: Sweep, job: SweepJob, directory: Path) -> tuple[str, ...]:
    """What follows the command: flm bench's arguments, or the trainer's exported flags."""
    if sweep.spec.workload == FLM_BENCH:
        return job.bench_args
    return tuple(trainer_argv(sweep.spec.workload, job.model, job.layout,
                              str(job_dir(directory.resolve(), job.key))))


def sweep_env(sweep: Sweep) -> tuple[tuple[str, str], ...]:
    """What the sweep's ``environment.env`` sets in every job, as the job sees it (booleans as
    1/0): the job scripts export it, the local executor passes it (manifest ``env``). The site's
    variables are not in it: they are the centre's settings for its nodes, which a local job
    does not run on."""
    return tuple((str(k), _env_value(v)) for k, v in (sweep.spec.environment.env or {}).items())


def _env_value(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def with_resources(sweep: Sweep, **overrides: str | None) -> Sweep:
    """The sweep with account / partition / qos / time replaced where given."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if not given:
        return sweep
    res = dataclasses.replace(sweep.spec.resources, **given)
    spec = dataclasses.replace(sweep.spec, resources=res)
    jobs = sweep.jobs
    if "time" in given:
        jobs = tuple(dataclasses.replace(j, time=given["time"]) for j in jobs)
    return dataclasses.replace(sweep, spec=spec, jobs=jobs)


def render_sweep(sweep: Sweep, directory: str | Path, allow_overtime: bool = False,
                 allow_oom: bool = False) -> Manifest:
    """Write scripts, manifest and the sweep file into ``directory``; return the manifest.
    ``allow_overtime``: write jobs whose predicted runtime is over their time limit too;
    ``allow_oom``: jobs the cost model predicts not to fit in memory too."""
    directory = Path(directory).resolve()
    _refuse_other_sweep(directory, sweep.name)
    if not allow_oom:
        refuse_predicted_oom(sweep)
    scripts = job_scripts(sweep, directory)
    # The site's rules first: a refused sweep leaves nothing written (docs/sites.md).
    site_policy.check(sweep.system.name, sweep.site,
                      [(len(g.packs), js.resources, 1 if g.concurrent else g.pack)
                       for g, js in scripts])
    site_policy.check_scripts(sweep.system.name, sweep.site, [js for _, js in scripts])
    res = scripts[0][1].resources if scripts else None
    steps = sweep.spec.warmup + sweep.spec.steps
    if sweep.spec.workload != FLM_BENCH:
        # A trainer runs the steps of its own flags, not flm bench's (jobs/workload.py).
        steps = steps_in_command(sweep.spec.workload, sweep.spec.workload_command, steps)
    leads = signal_leads(sweep)
    needs = dict(walltime.check(
        [(j.key, j.nodes, j.prediction.get("step_time_s"), j.time,
          walltime.steps_in(j.bench_args, steps) if sweep.spec.workload == FLM_BENCH else steps)
         for j in sweep.jobs], sweep.site,
        # A trainer job stops training when signalled: its lead is time it does not train.
        reserve={k: float(v.seconds) for k, v in leads.items()},
        partition=res.partition if res else None, qos=res.qos if res else None,
        allow_overtime=allow_overtime,
        staged=bool((sweep.spec.template_options or {}).get("stage_env")),
        pack=max((g.pack for g, _ in scripts if not g.concurrent), default=1)))
    # Every script is rendered before anything is written: a template the sandbox refuses,
    # or a value refused while rendering, leaves no folder behind.
    texts = [render(script) for _, script in scripts]
    # Everything is written into a staging folder beside the target and moved into place at
    # the end: a write that fails half way (a full disk, a quota) leaves no half-rendered
    # sweep folder that a later submit would take for a whole one (issue 38, item 8).
    with staged(directory) as stage:
        data = _write_sweep(sweep, directory, stage, scripts, texts, needs, leads)
    return Manifest(directory, data)


def refuse_predicted_oom(sweep: Sweep) -> None:
    """A UserError naming the sweep's jobs predicted not to fit in a GPU's memory, at any node
    count: a ``layouts:`` entry at 380 GB a 64 GB GCD rendered silently and would die at its
    first step, on 9,408 nodes 700-3,000 node-hours an attempt. A ``space:`` with
    ``fits_only: false`` asks for such layouts, and ``--allow-oom`` lets them through."""
    space = sweep.spec.space  # the sweep file's mapping (sweepspec builds its SweepSpace)
    if isinstance(space, dict) and space.get("fits_only") is False:
        return
    from frontier_llm.planner.plan import memory_bounds

    # The planner's verdict (docs/planner.md, "Will it fit?"): only a layout whose memory
    # interval lies wholly above the device is refused; a ``tight`` one (the interval straddles
    # it) is what published runs train with, and a sweep is how to find out.
    peaks = {j.key: float(j.prediction.get("peak_memory_bytes") or 0.0) for j in sweep.jobs}
    low, _ = memory_bounds(np.array(list(peaks.values()) or [0.0]))
    lows = dict(zip(peaks, low, strict=False))
    over = [j for j in sweep.jobs if lows[j.key] > sweep.system.memory_bytes]
    if not over:
        return
    worst = max(over, key=lambda j: peaks[j.key])
    raise UserError(
        f"sweep {sweep.name}: {len(over)} of its {len(sweep.jobs)} layouts are predicted not to "
        f"fit in a GPU's {sweep.system.memory_bytes / 1e9:.0f} GB, the worst {worst.key} at "
        f"{peaks[worst.key] / 1e9:,.0f} GB, even at the low end of its memory interval "
        f"({worst.nodes} nodes; flm predict shows the breakdown): each would fail at its first "
        "step. Remove them, or render with --allow-oom to measure them")


def _write_sweep(sweep: Sweep, directory: Path, stage: Path, scripts, texts: list[str],
                 needs: dict, leads: dict) -> dict:
    """Write the sweep folder's files into ``stage``, named as they will be in ``directory``
    (the scripts and the manifest name ``directory``'s paths); return the manifest's data."""
    def at(path: Path) -> Path:  # where a file of ``directory`` is written while staged
        return stage / Path(path).relative_to(directory)

    moves = input_files(sweep, directory)
    for source, copy in moves.items():
        at(inside(directory, "inputs")).mkdir(exist_ok=True)
        _write(at(Path(copy)), Path(source).read_text())
    by_key = {j.key: j for j in sweep.jobs}
    groups = []
    jobs = []
    for (group, script), text in zip(scripts, texts, strict=True):
        path = at(inside(directory, group.script))
        path.parent.mkdir(parents=True, exist_ok=True)
        at(inside(directory, group.log_dir)).mkdir(parents=True, exist_ok=True)
        # A sweep that opted in to settings that load code says so at the top of each script.
        _write(path, unsafe.with_note(text, sweep.spec.allow_unsafe or ()), mode=0o755)
        groups.append({"name": group.name, "script": group.script, "nodes": group.nodes,
                       "ranks_per_node": group.ranks_per_node, "time": group.time,
                       "size": len(group.keys), "log_dir": group.log_dir, "pack": group.pack,
                       "concurrent": group.concurrent})
        for position, key in enumerate(group.keys):
            job = by_key[key]
            for name, text in config_files(sweep.spec.workload, job.model, job.layout).items():
                at(job_dir(directory, key)).mkdir(parents=True, exist_ok=True)
                _write(at(job_dir(directory, key)) / name, text)
            # "index": the array task that runs the job; "step": its srun step in a packed one.
            jobs.append({
                "key": key, "group": group.name, "index": group.array_index(position),
                **({"step": position} if group.pack > 1 else {}), "script": group.script,
                "model": job.model.name, "model_ref": moves.get(job.model_ref, job.model_ref),
                "system": sweep.system.name, "nodes": job.nodes,
                "ranks_per_node": job.ranks_per_node, "world_size": job.world_size,
                "time": job.time,
                "layout": job.layout.to_dict(),
                "layout_hash": layout_hash(job.model, sweep.system.name, job.layout),
                "command": list(script.command),
                "argv": list(_moved(task_argv(sweep, job, directory), moves)),
                **({"workload": sweep.spec.workload} if job.after else {}),
                "prediction": dict(job.prediction),
                **({"predicted_runtime_s": round(needs[key])} if key in needs else {}),
                **({"signal_lead_s": leads[key].seconds} if key in leads else {}),
            })
    at(inside(directory, "traces")).mkdir(exist_ok=True)
    warnings = pack_warnings(sweep.spec.pack, sweep.spec.pack_mode,
                             [(g.name, len(g.keys), g.pack, g.nodes) for g, _ in scripts])
    # A node is billed whole unless its partition shares nodes and the job did not ask for
    # it exclusively (LUMI small-g bills the share: docs/sites.md).
    warnings += sub_node_warnings(
        sweep.spec.pack,
        [(g.name, len(g.keys), g.nodes, g.ranks_per_node, time_seconds(g.time),
          js.resources.exclusive or js.resources.partition not in sweep.site.shared_partitions)
         for g, js in scripts] if sweep.site.gpus else [],
        sweep.system.gpus_per_node,
        sweep.site.launcher == "srun" and sweep.site.binding != "cpu-masks", sweep.system.name)
    off_fs = out_warning(directory, sweep.site.parallel_fs, sweep.system.name,
                         sweep.site.source("parallel_fs"))
    warnings += [off_fs] if off_fs else []
    stage_hint = staging_warning([(j.key, j.nodes) for j in sweep.jobs], sweep.site.stage_dir,
                                 bool((sweep.spec.template_options or {}).get("stage_env")),
                                 sweep.system.name)
    warnings += [stage_hint] if stage_hint else []
    by_key_lead = [signal_lead.cap_warning(j.key, j.nodes, j.time, leads[j.key])
                   for j in sweep.jobs if j.key in leads]
    warnings += [w for w in by_key_lead if w]
    # Checked against the staged files (the job's config files are there until the move),
    # and told with the paths they will have.
    warnings += [w.replace(str(stage), str(directory))
                 for w in _workload_command(sweep, stage)[1]]
    data = {
        "sweep": sweep.name, "source": sweep.source, "template": sweep.template,
        "executor": sweep.spec.executor, "system": sweep.system.name,
        "frontier_llm": __version__, "skipped": dict(sweep.skipped),
        "groups": groups, "jobs": jobs,
        # Values as written in the sweep file (sweep.yaml beside, and the scripts, hold them too;
        # the loader refused secret-looking ones). pass_env: names only, never values.
        "env": [list(kv) for kv in sweep_env(sweep)],
        "pass_env": list(sweep.spec.environment.pass_env or ()),
        # What the sweep may waste without being wrong (jobs/render_warnings.py); the CLI
        # prints each line.
        "warnings": warnings,
        # The settings that load code or move files the sweep's author opted in to.
        **({"allow_unsafe": list(sweep.spec.allow_unsafe)} if sweep.spec.allow_unsafe else {}),
        # Checked again at submit against the user's jobs already queued (squeue --me).
        **({"queue_limit": {"site": sweep.system.name, "max_queued_jobs":
                            sweep.site.max_queued_jobs,
                            "source": sweep.site.source("max_queued_jobs")}}
           if sweep.site.max_queued_jobs else {}),
    }
    _write(stage / "sweep.yaml", sweep.text)
    _write(stage / MANIFEST, json.dumps(data, indent=1) + "\n")
    return data


@contextlib.contextmanager
def staged(directory: Path) -> Iterator[Path]:
    """A new, empty folder beside ``directory`` to write into; when ``with`` ends without an
    error, its files are moved into ``directory`` (the folder itself renamed into place when
    ``directory`` does not exist yet; one ``os.replace`` per file into an existing one, a
    re-render of the same sweep, with its manifest moved last). Renames within one file
    system need no free space, so a disk that fills up fails inside the staging folder,
    which is then removed: the target is either as it was or whole."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    stage = directory.parent / f".{directory.name}.flm-render-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        stage.mkdir()
    except OSError as exc:  # say it of the folder the user named, not of the staging one
        raise OSError(exc.errno, exc.strerror, str(directory)) from None
    try:
        yield stage
        try:
            os.rename(stage, directory)  # fails for an existing folder that is not empty
            return
        except OSError:
            if not directory.is_dir():
                raise
        _move_into(stage, directory)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _move_into(stage: Path, directory: Path) -> None:
    """Move every file under ``stage`` to the same place under ``directory``; the manifest
    last, so a folder whose manifest is new has every other new file already."""
    files = []
    for root, _dirs, names in os.walk(stage):
        files += [Path(root).relative_to(stage) / n for n in names]
    # Every place first, before anything moves: a link planted in the folder (at a file's name
    # or a sub-folder's) must not carry a rendered file out of it.
    for rel in files:
        inside(directory, rel)
    for rel in files:
        (directory / rel.parent).mkdir(parents=True, exist_ok=True)
    for rel in sorted(files, key=lambda r: r == Path(MANIFEST)):
        os.replace(stage / rel, directory / rel)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    write_text_atomic(path, text, mode)


def _refuse_other_sweep(directory: Path, name: str) -> None:
    """Refuse to render into the folder of another sweep: its manifest would be overwritten,
    and that sweep could no longer be tracked or cancelled. A path that is a file is refused
    in one line too."""
    if directory.exists() and not directory.is_dir():
        raise UserError(f"--out {directory} is a file, not a folder")
    path = directory / MANIFEST
    if not path.is_file():
        return
    try:
        other = json.loads(path.read_text()).get("sweep")
    except (OSError, ValueError, AttributeError):
        other = None
    if other != name:
        raise UserError(f"{directory} holds sweep {other!r}" if other else
                        f"{directory} holds a {MANIFEST} that is not a sweep's"
                        f"; render sweep {name} into a folder of its own (nothing was written)")


_held = threading.local()  # the sweep folders this thread holds the lock of


@contextlib.contextmanager
def sweep_lock(directory: str | Path) -> Iterator[None]:
    """Hold the sweep folder's submit lock (``flock`` on ``DIR/.flm-submit.lock``) inside
    ``with``, or refuse in one line when another command holds it. Two submits of one sweep at
    once each took the other's in-flight rows for an interrupted submit's and ran jobs twice.
    Re-entrant in one thread; released when the process ends, however it ends."""
    directory = Path(directory).resolve()
    held: set[str] = _held.__dict__.setdefault("folders", set())
    if str(directory) in held:
        yield
        return
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another flm"
            raise UserError(f"sweep folder {directory} is being submitted by {holder}; nothing "
                            "was submitted (wait for it to finish, then run this again)"
                            ) from None
        os.ftruncate(fd, 0)
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode(),
                  0)
        held.add(str(directory))
        try:
            yield
        finally:
            held.discard(str(directory))
    finally:
        os.close(fd)


def load_manifest(directory: str | Path) -> Manifest:
    directory = Path(directory).resolve()
    path = directory / MANIFEST
    if not path.is_file():
        raise UserError(f"{directory} holds no rendered sweep ({MANIFEST} is missing): run "
                        "'flm sweep render' or 'flm sweep submit' first")
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        raise UserError(f"{path} is not a manifest flm wrote (not JSON); render the sweep "
                        "again") from None
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise UserError(f"{path} is not a manifest flm wrote; render the sweep again")
    return Manifest(directory, data)
