"""What Python and a batch script must agree on, said once here and rendered into the script.

The job templates never spell these out: ``render.py`` passes :func:`template_values` to them
as ``contract``, so the run id a job gives its trace, the port its ranks meet on, the exit
status of a script asked for a task it does not have, and the banner line the classifier skips
in a log all come from the definitions below. ``tests/test_jobs_render.py`` runs the rendered
shell and compares what it computes with these functions.
"""

from __future__ import annotations

from frontier_llm.bench.placement import PASS_ENV_VAR
from frontier_llm.errors import ExitCode

# A run id is the job key and the scheduler's job id (an array's id for every task of it): the
# executor knows it at sbatch time, the script at run time, and both must give the same one.
RUN_ID_FORMAT = "{key}-j{job}"
# The job id as the script sees it: the array's id for array tasks, else the job's own.
_SHELL_JOB_ID = "${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-0}}"

# SLURM may requeue a job (a node failed, a preemption, scontrol requeue): the same job id runs
# again, with SLURM_RESTART_COUNT set to the number of restarts. Each such attempt gets a run
# id of its own (suffix -r<N>), so its trace, heartbeat and step files never mix with an
# earlier attempt's, and a log of its own beside the first one (sbatch --open-mode=append keeps
# the first attempt's output; later attempts write <index>-<job>.r<N>.out).
RESTART_SUFFIX = "-r{restart}"
# The submit token (flm sweep submit's, also in the job's --comment) reaches the job in this
# variable; the job writes it to <run-id>.token when it starts, so an interrupted submit can be
# reconciled from the sweep's folder after the scheduler has forgotten the job.
SUBMIT_TOKEN_ENV = "FLM_SUBMIT_TOKEN"
TOKEN_FILE = ".token"

# Ranks of several jobs may share a node: each job meets on base + (job id mod span), all below
# Linux's ephemeral range (net.ipv4.ip_local_port_range, default 32768-60999: kernel
# ip-sysctl documentation), where any outgoing connection of the node may already hold the port
# and rank 0's listen would fail with EADDRINUSE.
EPHEMERAL_LOW = 32768
DEFAULT_MASTER_PORT = 20000
MIN_MASTER_PORT_SPAN = 1000


def master_port_span(base: int) -> int:
    """Ports from ``base`` up to the ephemeral range."""
    return EPHEMERAL_LOW - base

# The first line a job script prints; classify.first_error_line skips it (it names the job key,
# which may hold any word, "error" included).
BANNER_PREFIX = "flm: task "

# A packed allocation (sweep ``pack: N``) runs several layouts as srun steps one after another;
# each step leaves files of its own beside its trace, so each layout's row is judged on its own
# step, not on the allocation: <run-id>.start (written when the step starts), <run-id>.exit (its
# exit status, when it ends) and <run-id>.log (the step's output).
STEP_START, STEP_EXIT, STEP_LOG = ".start", ".exit", ".log"
# Set (by sbatch --export) when only some layouts of a packed allocation are to run again
# (flm sweep retry): their keys joined by ":"; the others' steps are skipped.
PACK_KEYS_ENV = "FLM_PACK_KEYS"


def run_id(key: str, job_id: str | int, restart: int = 0) -> str:
    """The run id of job ``key`` under scheduler job (or array) ``job_id``, in its ``restart``-th
    requeue (0: the first time it runs)."""
    base = RUN_ID_FORMAT.format(key=key, job=job_id)
    return base + RESTART_SUFFIX.format(restart=restart) if restart else base


def restart_of(run_id_: str, key: str, job_id: str | int) -> int | None:
    """Which restart ``run_id_`` is of job ``key`` under ``job_id`` (None: not one of them)."""
    base = RUN_ID_FORMAT.format(key=key, job=job_id)
    if run_id_ == base:
        return 0
    tail = run_id_.removeprefix(base + "-r")
    return int(tail) if tail != run_id_ and tail.isdigit() else None


def attempt_log_name(index: int | str, job_id: str | int, restart: int = 0) -> str:
    """The log file (inside the group's log folder) of array task ``index`` of ``job_id``."""
    return f"{index}-{job_id}" + (f".r{restart}" if restart else "") + ".out"


def master_port(base: int, slurm_job_id: int, slot: int = 0, pack: int = 1) -> int:
    """The port rank 0 listens on in SLURM job ``slurm_job_id`` (the task's own id). The step in
    ``slot`` (0..pack-1) of a packed allocation gets a port of its own: steps may run side by
    side, and a finished step's port may linger in TIME_WAIT. Job ids of running jobs differ,
    so job id x pack + slot differs for every running step (array tasks included, whose ids
    SLURM does not hand out in index order)."""
    return base + (slurm_job_id * pack + slot) % master_port_span(base)


def template_values(master_port_base: int, pack: int = 1) -> dict[str, str | int]:
    """The shell text and numbers the job templates render (``contract.*``)."""
    return {
        # A double-quoted shell word; the script sets $key and $restart_suffix before it.
        "run_id": RUN_ID_FORMAT.format(key="${key}", job=_SHELL_JOB_ID) + "${restart_suffix}",
        "restart_suffix": RESTART_SUFFIX.format(restart="$SLURM_RESTART_COUNT"),
        "attempt_log": attempt_log_name("${SLURM_ARRAY_TASK_ID:-0}", _SHELL_JOB_ID,
                                        "$SLURM_RESTART_COUNT"),
        "submit_token_env": SUBMIT_TOKEN_ENV,
        "token_file": TOKEN_FILE,
        "master_port": f"$(( {int(master_port_base)} + ${{SLURM_JOB_ID:-0}} "
                       f"% {master_port_span(master_port_base)} ))",
        # A packed step's port: the script sets $slot (the step's place in its pack) before it.
        "step_master_port": f"$(( {int(master_port_base)} + (${{SLURM_JOB_ID:-0}} * {int(pack)} "
                            f"+ slot) % {master_port_span(master_port_base)} ))",
        "pack_keys_env": PACK_KEYS_ENV,
        "pass_env_var": PASS_ENV_VAR,
        "step_start": STEP_START,
        "step_exit": STEP_EXIT,
        "step_log": STEP_LOG,
        "exit_no_task": int(ExitCode.USAGE),
        "banner": BANNER_PREFIX,
    }
