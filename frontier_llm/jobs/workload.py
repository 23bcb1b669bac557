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
from frontier_llm.errors import SpecError
from frontier_llm.export import (
    DEEPSPEED,
    MEGATRON_DEEPSPEED,
    MEGATRON_LM,
    TORCHTITAN,
    TRAINERS,
    ExportRefused,
    ds_config_text,
    header,
    megatron_deepspeed_argv,
    megatron_lm_argv,
)
from frontier_llm.export.torchtitan import job_config_text
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.model import ModelSpec

FLM_BENCH = "flm-bench"
WORKLOADS = (FLM_BENCH, *TRAINERS)
# The trainer's output, beside the trace it becomes (<run-id><suffix> in the trace folder).
TRAINER_LOG = ".trainer.log"
# What the job runs after the trainer: the module entry point of frontier_llm/logs/job.py,
# with -P: the job's folder (a trainer's checkout, say) is not put on the import path
# (frontier_llm/child.py).
AFTER_COMMAND = tuple(python_module("frontier_llm.logs.job", python="python3"))


def check_workload(workload: str, command: Sequence[str] | None, bench_command: object,
                   executor: str, pack: int, bench_args: object = None) -> None:
    """One line for a workload the sweep cannot run (SpecError naming the key)."""
    if workload not in WORKLOADS:
        raise SpecError(f"unknown workload {workload!r} (one of {', '.join(WORKLOADS)})",
                        "workload")
    if workload == FLM_BENCH:
        if command is not None:
            raise SpecError("workload_command is for a trainer workload (workload: "
                            f"{' | '.join(TRAINERS)}); flm bench's own is command:",
                            "workload_command")
        return
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


# Under the srun launcher each rank is a SLURM task: torch.distributed's env:// rendezvous
# (Megatron, torchtitan, DeepSpeed) reads RANK, LOCAL_RANK and WORLD_SIZE, which srun names
# SLURM_PROCID, SLURM_LOCALID and SLURM_NTASKS (srun man page, OUTPUT ENVIRONMENT VARIABLES);
# torchrun sets them itself. MASTER_ADDR and MASTER_PORT are the job script's.
SRUN_RANK_ENV = ("bash", "-c", 'export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" '
                 'WORLD_SIZE="$SLURM_NTASKS"; exec "$@"', "flm-rank")


def rank_command(command: Sequence[str], launcher: str) -> tuple[str, ...]:
    """The user's command as each rank runs it under the site's launcher."""
    return (*SRUN_RANK_ENV, *command) if launcher == "srun" else tuple(command)


def config_files(trainer: str, model: ModelSpec, layout: Layout) -> dict[str, str]:
    """The files the trainer reads, by name in the job's folder (empty for Megatron-LM).
    ExportRefused (one line) when the trainer cannot express the layout."""
    if trainer == TORCHTITAN:
        return {"job_config.toml": job_config_text(model, layout,
                                                   header(trainer, model, layout))}
    if trainer == MEGATRON_DEEPSPEED:
        return {"ds_config.json": ds_config_text(model, layout, for_megatron=True)}
    if trainer == DEEPSPEED:
        return {"ds_config.json": ds_config_text(model, layout)}
    return {}


def trainer_argv(trainer: str, model: ModelSpec, layout: Layout, job_dir: str) -> list[str]:
    """What the job appends to the user's command: the flags, or the config file's path (the
    spelling of docs/export.md: torchtitan's ``--job.config_file``, DeepSpeed's
    ``--deepspeed --deepspeed_config``)."""
    if trainer == MEGATRON_LM:
        return megatron_lm_argv(model, layout)
    if trainer == MEGATRON_DEEPSPEED:
        return megatron_deepspeed_argv(model, layout, f"{job_dir}/ds_config.json")
    if trainer == TORCHTITAN:
        return ["--job.config_file", f"{job_dir}/job_config.toml"]
    if trainer == DEEPSPEED:
        return ["--deepspeed", "--deepspeed_config", f"{job_dir}/ds_config.json"]
    raise SpecError(f"unknown workload {trainer!r}", "workload")


# The flag that says how many optimizer steps the trainer runs, in the trainer's own source
# (docs/export.md, Sources): Megatron's --train-iters (megatron/training/arguments.py;
# Megatron-DeepSpeed megatron/arguments.py), torchtitan's [training] steps as a CLI override
# (torchtitan/config/job_config.py v0.2.2, Training.steps). Plain DeepSpeed has no such flag:
# the script is the user's.
STEP_FLAGS = {MEGATRON_LM: "--train-iters", MEGATRON_DEEPSPEED: "--train-iters",
              TORCHTITAN: "--training.steps"}


def steps_in_command(workload: str, command: Sequence[str] | None, default: int) -> int:
    """The optimizer steps a trainer job runs, for the walltime check: the last value of the
    trainer's own step flag in ``workload_command`` (``--flag N`` or ``--flag=N``), else
    ``default`` (the sweep's warm-up plus steps: say there what a DeepSpeed script runs)."""
    flag = STEP_FLAGS.get(workload)
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


def check_layout(trainer: str, model: ModelSpec, layout: Layout, key: str) -> None:
    """At load time: the export's own refusal, naming the job."""
    try:
        config_files(trainer, model, layout)
        trainer_argv(trainer, model, layout, ".")
    except ExportRefused as exc:
        raise SpecError(f"job {key}: {exc}", "workload") from None


def after_argv(trainer: str, model_ref: str, system_ref: str, layout: Layout,
               sweep: str, key: str) -> tuple[str, ...]:
    """The log-to-trace command the job runs when the trainer ends (the job adds --log,
    --run-id, --trace-dir and --exit-code): the layout and model are the job's, never read
    from the log."""
    return (*AFTER_COMMAND, "--trainer", trainer, "--model", model_ref, "--system", system_ref,
            "--layout-json", json.dumps(layout.to_dict(), sort_keys=True, separators=(",", ":")),
            "--sweep", sweep, "--job-key", key)
