"""Export a layout to another trainer: Megatron-LM and Megatron-DeepSpeed ``pretrain_gpt.py``
flags, torchtitan's job-config TOML, DeepSpeed's ``ds_config.json`` (docs/export.md).

Pure functions of (model, layout[, system]): :func:`export` returns the text; a trainer that
cannot express the layout raises :class:`ExportRefused` with one line saying why.
"""

from __future__ import annotations

from frontier_llm.errors import SpecError
from frontier_llm.export.deepspeed import DEEPSPEED, ds_config, ds_config_text
from frontier_llm.export.megatron import (
    DEFAULT_DS_CONFIG,
    MEGATRON_DEEPSPEED,
    MEGATRON_LM,
    megatron_deepspeed_argv,
    megatron_lm_argv,
    render_argv,
)
from frontier_llm.export.refusals import ExportRefused, refuse
from frontier_llm.export.torchtitan import TORCHTITAN, job_config, job_config_text
from frontier_llm.specs.forms import label
from frontier_llm.specs.layout import Engine, Layout, complete_layout
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec

TRAINERS = (MEGATRON_LM, MEGATRON_DEEPSPEED, TORCHTITAN, DEEPSPEED)
# The version each trainer's names were read from (docs/export.md cites file and commit).
SOURCES = {
    MEGATRON_LM: "Megatron-LM core_v0.15.3 (309ffca) megatron/training/arguments.py",
    MEGATRON_DEEPSPEED: "Megatron-DeepSpeed 4efb479 megatron/arguments.py",
    TORCHTITAN: "torchtitan v0.2.2 (73a0e69) torchtitan/config/job_config.py",
    DEEPSPEED: "DeepSpeed 0.19 deepspeed/runtime/config.py",
}

# The engine a layout given as flags belongs to when it names none: the one standing for the
# trainer in specs/engine_rules.py (Megatron-DeepSpeed: Megatron's model on DeepSpeed's engine,
# so a layout only DeepSpeed runs, ZeRO-3 say, is a DeepSpeed one).
TRAINER_ENGINES = {MEGATRON_LM: (Engine.MEGATRON,),
                   MEGATRON_DEEPSPEED: (Engine.MEGATRON, Engine.DEEPSPEED),
                   TORCHTITAN: (Engine.NATIVE,), DEEPSPEED: (Engine.DEEPSPEED,)}


def layout_for(trainer: str, values: dict) -> Layout:
    """A layout from flm's layout options (``given_options``); one that names no engine gets the
    trainer's, and a layout no engine builds is refused with the trainer's engine's rule."""
    if values.get("engine") is not None or trainer not in TRAINER_ENGINES:
        return Layout.from_dict(complete_layout(values))
    first: SpecError | None = None
    # Last the native engine, which runs the most: a layout no single flm engine runs (ZeRO-3
    # with sequence parallelism on Megatron-DeepSpeed) is then judged by the exporter's checks.
    for engine in dict.fromkeys((*TRAINER_ENGINES[trainer], Engine.NATIVE)):
        try:
            return Layout.from_dict(complete_layout({**values, "engine": engine.value}))
        except SpecError as exc:
            first = first or exc
    raise refuse(trainer, str(first))


def header(trainer: str, model: ModelSpec, layout: Layout,
           system: SystemSpec | None = None) -> list[str]:
    """The comment lines above the flags or the TOML: what, for what, from which source."""
    where = f" on {system.name}" if system is not None else ""
    return [f"flm export --to {trainer}: {model.name}{where}, {label(layout)}",
            f"names from {SOURCES[trainer]}"]


def export(trainer: str, model: ModelSpec, layout: Layout, system: SystemSpec | None = None,
           ds_config_path: str = DEFAULT_DS_CONFIG) -> str:
    """The trainer's text for ``layout``: flags, TOML or JSON (JSON has no comments)."""
    if trainer == MEGATRON_LM:
        return render_argv(megatron_lm_argv(model, layout), header(trainer, model, layout, system))
    if trainer == MEGATRON_DEEPSPEED:
        return render_argv(megatron_deepspeed_argv(model, layout, ds_config_path),
                           header(trainer, model, layout, system))
    if trainer == TORCHTITAN:
        return job_config_text(model, layout, header(trainer, model, layout, system))
    if trainer == DEEPSPEED:
        return ds_config_text(model, layout)
    raise ExportRefused(f"unknown trainer {trainer!r} (one of {', '.join(TRAINERS)})")


__all__ = ["DEEPSPEED", "MEGATRON_DEEPSPEED", "MEGATRON_LM", "SOURCES", "TORCHTITAN", "TRAINERS",
           "TRAINER_ENGINES", "ExportRefused", "ds_config", "ds_config_text", "export", "header",
           "job_config", "layout_for",
           "megatron_deepspeed_argv", "megatron_lm_argv"]
