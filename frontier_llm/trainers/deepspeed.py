"""DeepSpeed (a user's script with ``deepspeed.initialize``; DeepSpeed 0.19): the layout as its
``ds_config.json``, from the project's own builder (``trainers/deepspeed_config.py``, what ``flm
bench --engine deepspeed`` runs), adapted to a user's model.

Adapted how: ``tensor_parallel`` (AutoTP) keeps ``autotp_size`` but not flm bench's layer specs,
which name flm's own modules (AutoTP's default specs cover the usual Hugging Face models);
``steps_per_print`` is 10 (DeepSpeed's default, None, prints no step lines, and the user's logs
are what ``flm collect --from-logs`` reads), ``log_level`` is ``info`` (those lines are INFO, and
DeepSpeed's logger starts at WARNING unless its own launcher started the ranks) and
``gradient_clipping`` is left to the user. For Megatron-DeepSpeed (``for_megatron``) Megatron
does tensor parallelism, so there is no AutoTP block, and its mpu gives DeepSpeed the
data-parallel size.

``train_batch_size`` is always stated, with micro-batch and accumulation steps for dp replicas
(issue 36): DeepSpeed's samples/s is ``train_batch_size`` over the step time. With AutoTP and no
mpu, ``DeepSpeedConfig`` takes the whole world (dp x tp) as data parallel (runtime/config.py:
``world_size = dist.get_world_size()`` when ``mpu`` and ``mesh_device`` are None) and, given no
``train_batch_size``, derives one tp x too large. Stated, DeepSpeed checks it against micro x
accumulation x its data-parallel size (``_batch_assertion``): right with an mpu whose
data-parallel size is dp, refused loudly without one, never a silently tp x larger figure.
"""

from __future__ import annotations

from frontier_llm.errors import UserError
from frontier_llm.specs.layout import Engine, Layout
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec
from frontier_llm.trainers.base import Trainer
from frontier_llm.trainers.deepspeed_config import deepspeed_config, zero_settings
from frontier_llm.trainers.deepspeed_log import DeepSpeedLog
from frontier_llm.trainers.refusals import (
    check_engine_rules,
    check_megatron_deepspeed,
    check_mtp,
    refuse,
)
from frontier_llm.trainers.text import json_text

DEEPSPEED = "deepspeed"
DS_CONFIG = "ds_config.json"
# A step line every 10 steps (deepspeed/runtime/constants.py STEPS_PER_PRINT_DEFAULT is None).
STEPS_PER_PRINT = 10
# DeepSpeed's logger starts at WARNING (deepspeed/utils/logging.py, 0.19) and its step and
# throughput lines are INFO: without this key (runtime/config.py get_log_level, applied by the
# engine at initialize) steps_per_print prints nothing unless the `deepspeed` launcher, whose
# --log_level default is info, started the ranks. Under srun or torchrun it did not.
LOG_LEVEL = "info"


def zero_stage(trainer: str, layout: Layout) -> int:
    """The ZeRO stage of the layout's sharding (hpZ is stage 3), or a refusal saying why."""
    try:
        return zero_settings(layout)[0]
    except UserError as exc:
        raise refuse(trainer, str(exc)) from None


def ds_config(model: ModelSpec, layout: Layout, for_megatron: bool = False,
              bucket_mb: float | None = None) -> dict:
    """The ds_config dict (ExportRefused where DeepSpeed cannot run the layout)."""
    if for_megatron:
        check_megatron_deepspeed("megatron-deepspeed", layout, model)
    else:
        if layout.ep > 1:
            # DeepSpeed-MoE takes its expert-parallel degree as deepspeed.moe.layer.MoE's
            # ep_size argument in the model code (deepspeed/moe/layer.py, DeepSpeed 0.19), not
            # as a ds_config key: the file flm writes cannot carry it.
            raise refuse(DEEPSPEED, f"ep {layout.ep}: DeepSpeed's expert parallelism is the "
                         "ep_size argument of deepspeed.moe.layer.MoE in your model code, not "
                         "a ds_config key; export ep 1 and set ep_size there, or use --to "
                         "megatron-lm")
        # DeepSpeed's own reason for a placement it lacks (MiCS, removed in 0.19) before the
        # engine rule that says the same in flm's words.
        zero_stage(DEEPSPEED, layout)
        layout = check_engine_rules(DEEPSPEED, Engine.DEEPSPEED, layout, model)
        if layout.tp > 1 and layout.pp > 1:
            raise refuse(DEEPSPEED, "tensor parallelism in a ds_config is AutoTP "
                         "(tensor_parallel.autotp_size), whose 2-D (dp, tp) mesh spans every "
                         "rank, so it cannot share them with pipeline stages; tp with pp needs "
                         "Megatron-style layers (--to megatron-deepspeed)")
    zero_stage(DEEPSPEED, layout)  # MiCS and other placements DeepSpeed lacks: refused here
    cfg = deepspeed_config(layout, bucket_mb)  # a tuned bucket (flm tune best) or 64 MiB
    cfg["steps_per_print"] = STEPS_PER_PRINT
    cfg["log_level"] = LOG_LEVEL
    cfg.pop("gradient_clipping", None)
    if for_megatron:
        cfg.pop("tensor_parallel", None)
    elif "tensor_parallel" in cfg:
        cfg["tensor_parallel"] = {"autotp_size": layout.tp}
    # Always stated (module docstring): the bench builder leaves it out under AutoTP, where
    # flm bench passes no mpu and counts its own samples.
    cfg["train_batch_size"] = layout.global_batch
    return cfg


def z3_leaf_note(model: ModelSpec) -> str:
    """ZeRO-3 gathers each module's parameters on every rank; an MoE block whose experts only
    some ranks' tokens reach must be gathered as one unit."""
    return (f"ZeRO-3 with {model.name}'s experts: mark your MoE block class as a ZeRO-3 leaf "
            "module (deepspeed.utils.set_z3_leaf_modules(model, [YourMoEBlock]), "
            "deepspeed/utils/z3_leaf_module.py, DeepSpeed 0.19), so that its experts are "
            "gathered as one unit; otherwise a rank whose tokens skip an expert never joins "
            "the gather the others wait in")


def ds_config_text(model: ModelSpec, layout: Layout, for_megatron: bool = False,
                   bucket_mb: float | None = None) -> str:
    return json_text(ds_config(model, layout, for_megatron, bucket_mb))


def bucket_option(options: dict) -> float | None:
    value = options.get("bucket_mb")
    return None if value is None else float(value)  # type: ignore[arg-type]


class DeepSpeed(Trainer):
    name = DEEPSPEED
    aliases = ("ds", "deepspeed-autotp")
    title = "DeepSpeed"
    order = 4
    source = "DeepSpeed 0.19 deepspeed/runtime/config.py"
    engines = (Engine.DEEPSPEED,)
    tp_overlap_instead = "no such setting in the ds_config flm writes"
    log_reader = DeepSpeedLog()
    takes_bucket = True
    # The script is the user's: DeepSpeed has no step flag, checkpoint flag or exit signal of its
    # own (deepspeed.add_config_arguments adds --deepspeed and --deepspeed_config only).

    def check(self, model: ModelSpec, layout: Layout) -> Layout:
        # The training script is the user's; flm's DeepSpeed engine (flm bench) and the cost
        # model's deepspeed rules stand for a GPT without MTP modules.
        check_mtp(self.name, model, "DeepSpeed's config has no model section, and flm's "
                  "DeepSpeed engine builds no multi-token-prediction module")
        ds_config(model, layout)
        return layout

    def argv(self, model: ModelSpec, layout: Layout, job_dir: str) -> list[str]:
        self.check(model, layout)
        return ["--deepspeed", "--deepspeed_config", f"{job_dir}/{DS_CONFIG}"]

    def files(self, model: ModelSpec, layout: Layout, system: SystemSpec | None = None,
              **options: object) -> dict[str, str]:
        return {DS_CONFIG: ds_config_text(model, layout, bucket_mb=bucket_option(options))}

    def export_text(self, model: ModelSpec, layout: Layout, system: SystemSpec | None = None,
                    **options: object) -> str:
        # JSON: no comment lines
        return ds_config_text(model, layout, bucket_mb=bucket_option(options))

    def notes(self, model: ModelSpec, layout: Layout, **options: object) -> list[str]:
        out = super().notes(model, layout, **options)
        if layout.pp > 1:
            out.append(f"a ds_config has no pipeline degree: build PipelineModule(num_stages="
                       f"{layout.pp}) in your script")
        if model.is_moe and layout.zero_stage == 3:
            out.append(z3_leaf_note(model))
        if layout.tp > 1:
            out.append(f"AutoTP: pass deepspeed.initialize(mpu=...) an mpu whose data-parallel "
                       f"size is dp = {layout.dp}; without one DeepSpeed counts all "
                       f"{layout.world_size} ranks as data parallel and refuses train_batch_size "
                       f"{layout.global_batch} (runtime/config.py) instead of printing samples/s "
                       f"{layout.tp}x too high")
        return out


TRAINER = DeepSpeed()
