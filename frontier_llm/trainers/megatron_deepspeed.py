"""Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed ``pretrain_gpt.py --deepspeed``): Megatron's
model on DeepSpeed's engine. Its flags, the ds_config they name, its refusals, environment and
exit signal. Flag names from megatron/arguments.py at 4efb479 (docs/export.md); the environment
check and the signal handler were read at f4157be, whose lines are the same."""

from __future__ import annotations

from frontier_llm.specs.layout import DType, Engine, Layout, Schedule
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec
from frontier_llm.trainers.base import EnvVar, Trainer
from frontier_llm.trainers.deepspeed import bucket_option, ds_config, zero_stage
from frontier_llm.trainers.megatron_common import (
    DEFAULT_DS_CONFIG,
    SEQUENCE_PARALLEL_FLAG,
    ZERO_STAGE_FLAG,
    batch_and_degrees,
    dtype_args,
    model_args,
    recompute_args,
    render_argv,
)
from frontier_llm.trainers.megatron_log import MegatronLog
from frontier_llm.trainers.refusals import check_megatron_deepspeed, refuse
from frontier_llm.trainers.text import json_text

DS_CONFIG = "ds_config.json"
# megatron/arguments.py: on a "cuda" accelerator (DeepSpeed's CUDA accelerator, ROCm builds
# included) with --sequence-parallel it raises RuntimeError unless CUDA_DEVICE_MAX_CONNECTIONS
# is "1" (with --deepspeed its async all-reduce, the other trigger, is forced off).
MAX_CONNECTIONS = EnvVar(
    "CUDA_DEVICE_MAX_CONNECTIONS", "1",
    "Megatron-DeepSpeed megatron/arguments.py raises RuntimeError with --sequence-parallel "
    "without it")


class MegatronDeepSpeed(Trainer):
    name = "megatron-deepspeed"
    aliases = ("megatron_deepspeed", "mds", "megatron-ds")
    title = "Megatron-DeepSpeed"
    order = 2
    source = "Megatron-DeepSpeed 4efb479 megatron/arguments.py"
    engines = (Engine.MEGATRON, Engine.DEEPSPEED)
    # Megatron-DeepSpeed's arguments.py (f4157be) has --overlap-p2p-communication but no
    # --tp-comm-overlap: its TP collectives run exposed, so flm export refuses the setting.
    tp_overlap_instead = ("no such flag (megatron/arguments.py at f4157be has no "
                          "--tp-comm-overlap)")
    log_reader = MegatronLog()  # it prints Megatron's arguments and iteration lines
    step_flag = "--train-iters"
    save_flag = "--save"
    # --exit-signal-handler: save a checkpoint and stop on SIGTERM (megatron/arguments.py,
    # checked after every iteration in megatron/training.py).
    exit_signal = "TERM"
    exit_argv = ("--exit-signal-handler",)
    takes_bucket = True  # the ds_config's reduce / allgather buckets
    argv_names_files = True

    def check(self, model: ModelSpec, layout: Layout) -> Layout:
        if model.is_moe:
            # Its MoE is DeepSpeed-MoE with flags of its own (--num-experts as a list per
            # layer group, --topk, --expert-interval, --moe-expert-parallel-size:
            # megatron/arguments.py of microsoft/Megatron-DeepSpeed f4157be), whose layer
            # placement and dispatch flm does not model.
            raise refuse(self.name, f"{model.name} is a Mixture-of-Experts model and flm does "
                         "not write Megatron-DeepSpeed's DeepSpeed-MoE flags (--num-experts "
                         "per layer group, --expert-interval, --moe-expert-parallel-size): use "
                         "--to megatron-lm")
        if layout.dtype == DType.FP8:
            # Its FP8 is TransformerEngine's whole TransformerLayer in place of its own
            # (megatron/arguments.py 4efb479, _add_transformer_engine_args: --transformer-impl
            # transformer_engine with --fp8-hybrid or --fp8-e4m3, delayed scaling from an amax
            # history; megatron/model/transformer.py), under DeepSpeed's engine, whose
            # precision section is bf16 / fp16: a path flm neither models nor has run.
            raise refuse(self.name, "fp8: Megatron-DeepSpeed supports FP8 only as "
                         "--transformer-impl transformer_engine --fp8-hybrid (TransformerEngine's "
                         "layer, delayed scaling; its arguments.py at 4efb479), which flm does "
                         "not model: use --to megatron-lm (--fp8-format hybrid --fp8-recipe) or "
                         "--to torchtitan (torchao float8)")
        if layout.pp > 1 and layout.schedule == Schedule.INTERLEAVED:
            raise refuse(self.name, "interleaving: with --deepspeed its pipeline is DeepSpeed's "
                         "PipelineModule (GPTModelPipe), whose TrainSchedule is 1F1B only "
                         "(deepspeed/runtime/pipe/schedule.py); Megatron's interleaved schedule "
                         "runs without --deepspeed: use --to megatron-lm or --schedule 1f1b")
        if layout.pp > 1 and layout.zero_stage is not None and layout.zero_stage >= 2:
            raise refuse(self.name, f"ZeRO-{layout.zero_stage} with pp {layout.pp}: its "
                         "pipeline runs on DeepSpeed's PipelineEngine, which asserts 'ZeRO-2 and "
                         "ZeRO-3 are incompatible with pipeline parallelism' (deepspeed/runtime/"
                         "pipe/engine.py): use zero1 with pipelines, or pp 1 with ZeRO-"
                         f"{layout.zero_stage}")
        zero_stage(self.name, layout)  # DeepSpeed's own reason for a placement it lacks (MiCS)
        return check_megatron_deepspeed(self.name, layout, model)

    def flags(self, model: ModelSpec, layout: Layout,
              ds_config_path: str = DEFAULT_DS_CONFIG) -> list[str]:
        """``pretrain_gpt.py`` flags with ``--deepspeed``: ZeRO, micro-batch and precision also
        live in the ds_config at ``ds_config_path``."""
        layout = self.check(model, layout)
        argv = model_args(model, deepspeed=True) + batch_and_degrees(layout)
        if layout.pp == 1:
            # Without it Megatron-DeepSpeed builds GPTModelPipe even for one stage.
            argv.append("--no-pipeline-parallel")
        if layout.sequence_parallel:
            argv.append(SEQUENCE_PARALLEL_FLAG)
        argv += recompute_args(layout)
        argv += dtype_args(layout)
        if layout.flash_attention:
            argv.append("--use-flash-attn-v2")
        argv += ["--deepspeed", "--deepspeed_config", ds_config_path,
                 ZERO_STAGE_FLAG, str(zero_stage(self.name, layout))]
        return argv

    def ds_config(self, model: ModelSpec, layout: Layout, bucket_mb: float | None = None) -> dict:
        """The ds_config its flags name: Megatron does tensor parallelism (no AutoTP block) and
        its mpu gives DeepSpeed the data-parallel size, so train_batch_size stays."""
        self.check(model, layout)
        return ds_config(model, layout, for_megatron=True, bucket_mb=bucket_mb)

    def argv(self, model: ModelSpec, layout: Layout, job_dir: str) -> list[str]:
        return self.flags(model, layout, f"{job_dir}/{DS_CONFIG}")

    def files(self, model: ModelSpec, layout: Layout, system: SystemSpec | None = None,
              **options: object) -> dict[str, str]:
        return {DS_CONFIG: json_text(self.ds_config(model, layout, bucket_option(options)))}

    def export_text(self, model: ModelSpec, layout: Layout, system: SystemSpec | None = None,
                    **options: object) -> str:
        path = str(options.get("ds_config_path") or DEFAULT_DS_CONFIG)
        return render_argv(self.flags(model, layout, path), self.header(model, layout, system))

    def required_env(self, model: ModelSpec, layout: Layout) -> tuple[EnvVar, ...]:
        return (MAX_CONNECTIONS,) if layout.sequence_parallel else ()


TRAINER = MegatronDeepSpeed()
