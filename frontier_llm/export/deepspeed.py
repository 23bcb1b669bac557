"""A layout as DeepSpeed's ``ds_config.json``: the project's own builder
(``bench/deepspeed_config.py``, what ``flm bench --engine deepspeed`` runs), adapted to a user's
model.

Adapted how: ``tensor_parallel`` (AutoTP) keeps ``autotp_size`` but not flm bench's layer specs,
which name flm's own modules (AutoTP's default specs cover the usual Hugging Face models);
``steps_per_print`` is 10 (DeepSpeed's default, None, prints no step lines, and the user's logs
are what ``flm collect --from-logs`` reads), ``log_level`` is ``info`` (those lines are INFO, and
DeepSpeed's logger starts at WARNING unless its own launcher started the ranks) and
``gradient_clipping`` is left to the user. For Megatron-DeepSpeed (``for_megatron``) Megatron
does tensor parallelism, so there is no AutoTP block, and its mpu gives DeepSpeed the
data-parallel size, so ``train_batch_size`` stays.
"""

from __future__ import annotations

import json

from frontier_llm.bench.deepspeed_config import deepspeed_config, zero_settings
from frontier_llm.errors import UserError
from frontier_llm.export.refusals import check_engine_rules, refuse
from frontier_llm.specs.layout import Engine, Layout
from frontier_llm.specs.model import ModelSpec

DEEPSPEED = "deepspeed"
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


def ds_config(model: ModelSpec, layout: Layout, for_megatron: bool = False) -> dict:
    """The ds_config dict (ExportRefused where DeepSpeed cannot run the layout)."""
    if for_megatron:
        from frontier_llm.export.refusals import check_megatron_deepspeed

        check_megatron_deepspeed("megatron-deepspeed", layout, model)
    else:
        layout = check_engine_rules(DEEPSPEED, Engine.DEEPSPEED, layout, model)
        if layout.tp > 1 and layout.pp > 1:
            raise refuse(DEEPSPEED, "tensor parallelism in a ds_config is AutoTP "
                         "(tensor_parallel.autotp_size), whose 2-D (dp, tp) mesh spans every "
                         "rank, so it cannot share them with pipeline stages; tp with pp needs "
                         "Megatron-style layers (--to megatron-deepspeed)")
    zero_stage(DEEPSPEED, layout)  # MiCS and other placements DeepSpeed lacks: refused here
    cfg = deepspeed_config(layout)
    cfg["steps_per_print"] = STEPS_PER_PRINT
    cfg["log_level"] = LOG_LEVEL
    cfg.pop("gradient_clipping", None)
    if for_megatron:
        cfg.pop("tensor_parallel", None)
        cfg["train_batch_size"] = layout.global_batch
    elif "tensor_parallel" in cfg:
        cfg["tensor_parallel"] = {"autotp_size": layout.tp}
    return cfg


def ds_config_text(model: ModelSpec, layout: Layout, for_megatron: bool = False) -> str:
    return json.dumps(ds_config(model, layout, for_megatron), indent=2) + "\n"
