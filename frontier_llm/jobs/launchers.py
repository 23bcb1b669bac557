"""Launchers: how a job script starts its ranks, one small class per launcher.

Each class turns the job's resources and the site's binding into the launch line of the script
(``command()``), and says how the batch allocation must be shaped for it (``sbatch_shape()``):
srun starts one task per rank; torchrun runs as one task per node that owns the node's CPUs and
starts the node's ranks itself; mpiexec starts every rank from the batch shell.

Every value passes ``shlex.quote``; the only unquoted text is shell on purpose: ``"$@"`` (the
task's ``flm bench`` arguments) and the script's own ``$run_id``/``$trace_dir``/``$MASTER_*``.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from frontier_llm.bench.placement import collective_timeout_s
from frontier_llm.errors import SpecError
from frontier_llm.specs.site import Site

# What follows the rank command on every launch line: the task's arguments and the run's names.
RANK_TAIL = '"$@" --run-id "$run_id" --trace-dir "$trace_dir"'
# A trainer workload's ranks take the task's arguments only (the run's names are flm bench's).
TRAINER_TAIL = '"$@"'
# After the first rank exits, the others have their collective timeout to fail too, then this
# long for rank 0 to gather the ranks' errors and write the failed trace.
TRACE_GRACE_S = 60


def srun_bounds(world_size: int) -> list[str]:
    """srun options that end a step whose ranks are stuck (srun man page): a rank's non-zero
    exit does not kill the others at once (--kill-on-bad-exit=0: rank 0 still writes the failed
    trace), but once one rank has exited the rest get the collective timeout plus a grace
    (--wait), so a rank hung outside a collective cannot hold the allocation to its time limit.
    The collective timeout grows by a fixed time per doubling of the ranks (bench.placement):
    a full Frontier job (75,264 ranks) waits 426 + 1 + 60 s, not the 7,617 s of a timeout
    linear in the ranks, which outlived a 2-hour job."""
    wait = int(collective_timeout_s(world_size, {})) + 1 + TRACE_GRACE_S
    return ["--kill-on-bad-exit=0", f"--wait={wait}"]


@dataclass(frozen=True)
class Shape:
    """What the launch needs of the allocation: tasks per node and CPUs per task."""

    ntasks_per_node: int
    cpus_per_task: int | None


@dataclass(frozen=True)
class LaunchJob:
    """The inputs of a launch line: placement, the rank command and the site."""

    nodes: int
    ranks_per_node: int
    gpus_per_node: int | None
    cpus_per_task: int | None  # per rank
    command: tuple[str, ...]
    site: Site
    overcommit: bool = False
    # A step beside others in one allocation (concurrent pack): srun --exact gives it only the
    # CPUs and GPUs it asks for, so the steps do not wait for each other (srun man page).
    exact: bool = False
    tail: str = RANK_TAIL  # what follows the rank command (TRAINER_TAIL for a trainer)
    # The allocation holds its nodes whole (False: a share of a node, LUMI small-g/dev-g without
    # --exclusive): the site's per-node CPU masks name cores it may not have.
    whole_node: bool = True


def _q(words) -> str:
    return " ".join(shlex.quote(str(w)) for w in words)


class Launcher:
    """One launch method. Subclasses implement :meth:`command` (and :meth:`sbatch_shape`)."""

    name = ""

    def __init__(self, job: LaunchJob) -> None:
        self.job = job

    def sbatch_shape(self) -> Shape:
        return Shape(self.job.ranks_per_node, self.job.cpus_per_task)

    def command(self) -> str:
        raise NotImplementedError

    def _container(self) -> list[str]:
        """pyxis options (NVIDIA/pyxis wiki, Usage): they exist on srun only."""
        site = self.job.site
        out = []
        if site.container_image:
            out.append(f"--container-image={site.container_image}")
        if site.container_mounts:
            out.append(f"--container-mounts={site.container_mounts}")
        return out


class SrunLauncher(Launcher):
    """One srun task per rank, with the site's binding.

    ``--cpus-per-task`` is always given to srun: since SLURM 22.05 srun does not inherit it from
    sbatch (sbatch man page), so ranks would otherwise share one core.
    """

    name = "srun"

    def command(self) -> str:
        j = self.job
        if j.overcommit:  # the local CPU cluster: more ranks than cores, no binding
            words = ["srun", "--overcommit", f"--ntasks={j.nodes * j.ranks_per_node}"]
        else:
            # The task count always (OLCF Frontier user guide, "Mapping 1 GPU per task":
            # --gpus-per-task "requires an explicit task count, e.g. -n"; its examples give
            # -N, -n and -c on every srun line).
            words = ["srun", f"--nodes={j.nodes}", f"--ntasks={j.nodes * j.ranks_per_node}",
                     f"--ntasks-per-node={j.ranks_per_node}"]
            if j.cpus_per_task:
                words.append(f"--cpus-per-task={j.cpus_per_task}")
            words += self._binding()
        if j.exact:
            # Overcommitted (the local CPU cluster) the allocation has fewer CPUs than ranks and
            # --exact refuses a step ("More processors requested than permitted"): there the
            # steps share the allocation's CPUs (--overlap), as its ranks do anyway.
            words.append("--overlap" if j.overcommit else "--exact")
        words += srun_bounds(j.nodes * j.ranks_per_node)
        words += self._container()
        return f"{_q(words)} \\\n    {_q(self._in_image(j.command))} {j.tail}"

    def _in_image(self, command: tuple[str, ...]) -> list[str]:
        """The rank command inside the site's Singularity image, when it names one (LUMI AI
        guide: srun ... singularity run [-B ...] IMAGE command)."""
        site = self.job.site
        if not site.singularity_image:
            return list(command)
        binds = [w for b in site.singularity_binds for w in ("-B", b)]
        return ["singularity", "run", *binds, site.singularity_image, *command]

    def _binding(self) -> list[str]:
        j, site = self.job, self.job.site
        if not j.gpus_per_node:
            return []
        if site.binding == "closest":
            # Each rank gets one GPU, the one on its L3 region, relabelled 0 (OLCF: srun
            # --gpus-per-task=1 --gpu-bind=closest).
            return ["--gpus-per-task=1", "--gpu-bind=closest"]
        if site.binding == "cpu-masks" and not j.whole_node:
            # LUMI: "Binding only applies if you have a full-node allocation" (lumi-userguide
            # docs/runjobs/scheduled-jobs/lumig-job.md, "GPU Binding"); a mask outside the
            # job's share of the node fails the step ("CPU binding outside of job step
            # allocation"). The GPUs it was given are its own, numbered from 0, as in the
            # LUMI AI guide's small-g script (01-quickstart/run.sh: no binding).
            return [f"--gpus-per-node={j.gpus_per_node}"]
        if site.binding == "cpu-masks":
            masks = site.cpu_masks
            if len(masks) < j.ranks_per_node:
                raise SpecError(f"site.cpu_masks has {len(masks)} masks for {j.ranks_per_node} "
                                "ranks per node", "cpu_masks")
            # Every rank sees every GPU of its node and picks local rank mod count (LUMI).
            return [f"--gpus-per-node={j.gpus_per_node}",
                    "--cpu-bind=mask_cpu:" + ",".join(masks[:j.ranks_per_node])]
        words = [f"--gpus-per-node={j.gpus_per_node}"]
        if site.distribution:
            words.append(f"--distribution={site.distribution}")
        if site.threads_per_core:
            # Before --cpu-bind: srun's --threads-per-core implies --cpu-bind=threads "unless
            # overridden" (srun man page), and -c then counts cores, not hardware threads.
            words.append(f"--threads-per-core={site.threads_per_core}")
        if site.cpu_bind:
            words.append(f"--cpu-bind={site.cpu_bind}")
        return words


class TorchrunLauncher(Launcher):
    """One srun task per node owning all the node's CPUs; torchrun starts the node's ranks.

    ``--no-python`` makes torchrun run the sweep's ``command:`` as given (``flm bench`` or any
    other program), not a Python script.
    """

    name = "torchrun"

    def sbatch_shape(self) -> Shape:
        j = self.job
        cpus = j.cpus_per_task * j.ranks_per_node if j.cpus_per_task else None
        return Shape(1, cpus)

    def command(self) -> str:
        j = self.job
        shape = self.sbatch_shape()
        words = ["srun", f"--nodes={j.nodes}", "--ntasks-per-node=1"]
        if shape.cpus_per_task:
            words.append(f"--cpus-per-task={shape.cpus_per_task}")
        if j.gpus_per_node:
            words.append(f"--gpus-per-node={j.gpus_per_node}")
        if j.site.threads_per_core:
            words.append(f"--threads-per-core={j.site.threads_per_core}")
        words += srun_bounds(j.nodes * j.ranks_per_node)
        words += self._container()
        run = ["torchrun", f"--nnodes={j.nodes}", f"--nproc-per-node={j.ranks_per_node}",
               "--rdzv-backend=c10d"]
        if j.site.numa_binding:
            # srun binds the one task per node to all the node's CPUs; torchrun's workers would
            # float over both sockets without this (PyTorch "NUMA Binding", torchrun
            # --numa-binding=node: each worker on its GPU's NUMA node).
            run.append(f"--numa-binding={j.site.numa_binding}")
        return (f"{_q(words)} \\\n    {_q(run)} --rdzv-endpoint=\"$MASTER_ADDR:$MASTER_PORT\" "
                f"--rdzv-id=\"$run_id\" --no-python \\\n    {_q(j.command)} {j.tail}")


class MpiexecLauncher(Launcher):
    """MPICH's Hydra from the batch shell: ``-n`` ranks, ``-ppn`` per node."""

    name = "mpiexec"

    def command(self) -> str:
        j = self.job
        words = ["mpiexec", "-n", str(j.nodes * j.ranks_per_node), "-ppn", str(j.ranks_per_node)]
        return f"{_q(words)} \\\n    {_q(j.command)} {j.tail}"


LAUNCHERS: dict[str, type[Launcher]] = {
    cls.name: cls for cls in (SrunLauncher, TorchrunLauncher, MpiexecLauncher)}


def launcher_for(job: LaunchJob) -> Launcher:
    """The launcher the site names."""
    try:
        return LAUNCHERS[job.site.launcher](job)
    except KeyError:
        raise SpecError(f"site.launcher must be one of {', '.join(LAUNCHERS)} "
                        f"(got {job.site.launcher!r})", "launcher") from None
