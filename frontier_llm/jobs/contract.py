"""What Python and a batch script must agree on, said once here and rendered into the script.

The job templates never spell these out: ``render.py`` passes :func:`template_values` to them
as ``contract``, so the run id a job gives its trace, the port its ranks meet on, the exit
status of a script asked for a task it does not have, and the banner line the classifier skips
in a log all come from the definitions below. ``tests/test_jobs_render.py`` runs the rendered
shell and compares what it computes with these functions.
"""

from __future__ import annotations

from frontier_llm.errors import ExitCode

# A run id is the job key and the scheduler's job id (an array's id for every task of it): the
# executor knows it at sbatch time, the script at run time, and both must give the same one.
RUN_ID_FORMAT = "{key}-j{job}"
# The job id as the script sees it: the array's id for array tasks, else the job's own.
_SHELL_JOB_ID = "${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-0}}"

# Ranks of several jobs may share a node: each job meets on base + (job id mod span).
MASTER_PORT_SPAN = 20000
DEFAULT_MASTER_PORT = 29500

# The first line a job script prints; classify.first_error_line skips it (it names the job key,
# which may hold any word, "error" included).
BANNER_PREFIX = "flm: task "


def run_id(key: str, job_id: str | int) -> str:
    """The run id of job ``key`` under scheduler job (or array) ``job_id``."""
    return RUN_ID_FORMAT.format(key=key, job=job_id)


def master_port(base: int, slurm_job_id: int) -> int:
    """The port rank 0 listens on in SLURM job ``slurm_job_id`` (the task's own id)."""
    return base + slurm_job_id % MASTER_PORT_SPAN


def template_values(master_port_base: int) -> dict[str, str | int]:
    """The shell text and numbers the job templates render (``contract.*``)."""
    return {
        # A double-quoted shell word; the script sets $key before it.
        "run_id": RUN_ID_FORMAT.format(key="${key}", job=_SHELL_JOB_ID),
        "master_port": f"$(( {int(master_port_base)} + ${{SLURM_JOB_ID:-0}} "
                       f"% {MASTER_PORT_SPAN} ))",
        "exit_no_task": int(ExitCode.USAGE),
        "banner": BANNER_PREFIX,
    }
