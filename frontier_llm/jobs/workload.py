"""Sweeps of the user's own trainer (sweep key ``workload:``; docs/export.md "Sweeps of your own
trainer").

A ``flm-bench`` sweep runs ``flm bench`` with the layout's bench flags. A trainer workload
(``megatron-lm``, ``megatron-deepspeed``, ``torchtitan``, ``deepspeed``) runs the sweep's
``workload_command`` with the layout as ``flm export`` writes it: Megatron flags appended to the
command; torchtitan's TOML, or a ds_config, written into the job's own folder and its path
passed. Everything else of the job (site template, binding, environment, deadline, failure
handling) is the same; when the trainer ends, the job turns its log into the run's trace
(``python -m frontier_llm.logs.job``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from frontier_llm.child import python_module
from frontier_llm.errors import SpecError, UserError
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.site import Site
from frontier_llm.trainers import NAMES, Trainer, get
from frontier_llm.trainers.base import EnvVar

FLM_BENCH = "flm-bench"
WORKLOADS = (FLM_BENCH, *NAMES)
TRAINERS = NAMES
# The trainer's output, beside the trace it becomes (<run-id><suffix> in the trace folder).
TRAINER_LOG = ".trainer.log"
# What the job runs after the trainer: the module entry point of frontier_llm/logs/job.py,
# with -P: the job's folder (a trainer's checkout, say) is not put on the import path
# (frontier_llm/child.py).
AFTER_COMMAND = tuple(python_module("frontier_llm.logs.job", python="python3"))
# workload_command may name the job's own folder (<sweep folder>/jobs/<key>): each rank's shell
# replaces this text in every word, so each job of a sweep gets its own checkpoint directory
# (``--save {job_dir}/checkpoints``). The job exports the folder as JOB_DIR_VAR.
JOB_DIR = "{job_dir}"
JOB_DIR_VAR = "FLM_JOB_DIR"


def trainer(workload: str) -> Trainer:
    """The registry's trainer for a trainer workload (SpecError naming the key)."""
    try:
        return get(workload)
    except UserError:
        raise SpecError(f"unknown workload {workload!r} (one of {', '.join(WORKLOADS)})",
                        "workload") from None


def check_workload(workload: str, command: Sequence[str] | None, bench_command: object,
                   executor: str, pack: int, bench_args: object = None) -> None:
    """One line for a workload the sweep cannot run (SpecError naming the key)."""
    if workload == FLM_BENCH:
        if command is not None:
            raise SpecError("workload_command is for a trainer workload (workload: "
                            f"{' | '.join(TRAINERS)}); flm bench's own is command:",
                            "workload_command")
        return
    trainer(workload)
    if not command:
        raise SpecError(f"workload {workload} needs workload_command: the trainer's command "
                        "or entry script, e.g. [python, pretrain_gpt.py]", "workload_command")
    if bench_command is not None:
        raise SpecError(f"command: replaces flm bench; workload {workload} runs "
                        "workload_command", "command")
    if bench_args:
        raise SpecError(f"bench_args are flm bench options; workload {workload} takes its "
                        "own options in workload_command", "bench_args")
    # The local executor runs a job's command line itself, not its script (no log-to-trace
    # step); packed steps share one allocation's script path, not written for trainers yet.
    if executor != "slurm":
        raise SpecError(f"workload {workload} runs under executor: slurm only", "executor")
    if pack != 1:
        raise SpecError(f"workload {workload} runs one layout per allocation (pack: 1)", "pack")


def _rank_shell(env: dict[str, str]) -> str:
    """The rank wrapper's script: the rank variables, then the user's words with the job's
    folder in place of {job_dir}, exec'd (so the trainer gets the job's signals itself)."""
    exports = "".join(f"export {k}={v}; " for k, v in env.items())
    return (f'{exports}p={JOB_DIR}; a=(); for w in "$@"; do a+=("${{w//"$p"/${JOB_DIR_VAR}}}"); '
            'done; exec "${a[@]}"')


def rank_command(workload: str, command: Sequence[str], site: Site) -> tuple[str, ...]:
    """The user's command as each rank runs it under the site's launcher and GPU binding.

    Under srun each rank is a SLURM task and the trainer's rank environment comes from it
    (Trainer.rank_env: RANK, WORLD_SIZE and LOCAL_RANK, the last by the site's binding);
    torchrun and mpiexec set their own. MASTER_ADDR and MASTER_PORT are the job script's."""
    env = trainer(workload).rank_env(site.binding) if site.launcher == "srun" else {}
    return ("bash", "-c", _rank_shell(env), "flm-rank", *command)


def config_files(workload: str, model: ModelSpec, layout: Layout) -> dict[str, str]:
    """The files the trainer reads, by name in the job's folder (empty for Megatron-LM).
    ExportRefused (one line) when the trainer cannot express the layout; none for flm bench."""
    return {} if workload == FLM_BENCH else trainer(workload).files(model, layout)


def trainer_argv(workload: str, model: ModelSpec, layout: Layout, job_dir: str) -> list[str]:
    """What the job appends to the user's command: the flags, or the config file's path (the
    spelling of docs/export.md: torchtitan's ``--job.config_file``, DeepSpeed's
    ``--deepspeed --deepspeed_config``), and the flag that makes the trainer save and stop on
    the job's pre-deadline signal where it has one."""
    t = trainer(workload)
    return [*t.argv(model, layout, job_dir), *t.exit_argv]


def task_env(workload: str, model: ModelSpec, layout: Layout,
             job_dir: str) -> tuple[tuple[str, str], ...]:
    """What one trainer job exports: the variables the trainer requires for this layout (on
    every site) and the job's folder, for {job_dir} in workload_command."""
    need: tuple[EnvVar, ...] = trainer(workload).required_env(model, layout)
    return (*((v.name, v.value) for v in need), (JOB_DIR_VAR, job_dir))


def exit_signal(workload: str) -> str | None:
    """The signal the trainer saves a checkpoint and stops on (None: it has none)."""
    return trainer(workload).exit_signal


def steps_in_command(workload: str, command: Sequence[str] | None, default: int) -> int:
    """The optimizer steps a trainer job runs, for the walltime check: the last value of the
    trainer's own step flag in ``workload_command`` (``--flag N`` or ``--flag=N``), else
    ``default`` (the sweep's warm-up plus steps: say there what a DeepSpeed script runs)."""
    flag = trainer(workload).step_flag
    found = None
    words = list(command or ())
    for i, word in enumerate(words):
        if flag is None:
            break
        value = words[i + 1] if word == flag and i + 1 < len(words) else \
            word.split("=", 1)[1] if word.startswith(flag + "=") else None
        if value is not None and str(value).isdigit():
            found = int(value)
    return default if found is None else found


def check_layout(workload: str, model: ModelSpec, layout: Layout, key: str) -> None:
    """At load time: the export's own refusal, naming the job."""
    try:
        config_files(workload, model, layout)
        trainer_argv(workload, model, layout, ".")
    except UserError as exc:
        raise SpecError(f"job {key}: {exc}", "workload") from None


def check_save_dirs(workload: str, command: Sequence[str], jobs: int) -> None:
    """Jobs of one sweep must not share a checkpoint directory: a save flag in workload_command
    whose value lacks {job_dir} is refused when the sweep has more than one job."""
    flag = trainer(workload).save_flag
    words = [str(w) for w in command]
    for i, word in enumerate(words):
        value = words[i + 1] if word == flag and i + 1 < len(words) else \
            word.split("=", 1)[1] if flag and word.startswith(flag + "=") else None
        if value is not None and JOB_DIR not in value and jobs > 1:
            raise SpecError(f"workload_command: {flag} {value} would be one checkpoint directory "
                            f"for all {jobs} jobs; write {flag} {JOB_DIR}/checkpoints (each "
                            "job's own folder)", "workload_command")


def after_argv(workload: str, model_ref: str, system_ref: str, layout: Layout,
               sweep: str, key: str) -> tuple[str, ...]:
    """The log-to-trace command the job runs when the trainer ends (the job adds --log,
    --run-id, --trace-dir and --exit-code): the layout and model are the job's, never read
    from the log."""
    return (*AFTER_COMMAND, "--trainer", trainer(workload).name, "--model", model_ref,
            "--system", system_ref,
            "--layout-json", json.dumps(layout.to_dict(), sort_keys=True, separators=(",", ":")),
            "--sweep", sweep, "--job-key", key)
