"""Why a trainer cannot run a layout: the engine rules first, then what only the trainer lacks.

Each trainer is checked against the rules of the engine that stands for it in
``specs/engine_rules.py`` (:data:`TRAINER_ENGINE`): Megatron-LM is the ``megatron`` engine,
torchtitan the ``native`` one (PyTorch FSDP2, DTensor TP and ``torch.distributed.pipelining``, the
stack torchtitan is built on), plain DeepSpeed the ``deepspeed`` one. Megatron-DeepSpeed is
Megatron-LM's model code on DeepSpeed's engine (``--deepspeed``): the Megatron rules for what the
model does, DeepSpeed's for the sharding and the pipeline schedule (its ``GPTModelPipe`` runs on
DeepSpeed's ``PipelineEngine``). A refusal is one line that names the trainer and the reason.
"""

from __future__ import annotations

import dataclasses

from frontier_llm.errors import SpecError, UserError
from frontier_llm.specs.engine_rules import RULES
from frontier_llm.specs.layout import Engine, Layout
from frontier_llm.specs.model import ModelSpec

# The rules that depend on how model states are sharded and pipelined: Megatron-DeepSpeed takes
# them from DeepSpeed, everything else from Megatron.
_DEEPSPEED_PART = ("schedule", "sharding", "pipeline_sharding")


class ExportRefused(UserError):
    """The trainer cannot express the layout (one line: the trainer and why)."""


def refuse(trainer: str, why: str) -> ExportRefused:
    return ExportRefused(f"{trainer} cannot run this layout: {why}")


def check_mtp(trainer: str, model: ModelSpec, how: str) -> None:
    """Refuse a model with multi-token-prediction modules where the trainer (as flm writes it)
    builds none: the run would train without them while flm prices them. ``how``: what the
    trainer lacks, with its source."""
    if model.mtp_layers:
        raise refuse(trainer, f"{model.name}'s {model.mtp_layers} multi-token-prediction "
                     f"module(s) (mtp_layers): {how}; export to megatron-lm "
                     "(--mtp-num-layers)")


def check_engine_rules(trainer: str, engine: Engine, layout: Layout, model: ModelSpec) -> Layout:
    """The layout as ``engine`` runs it (its split of layers over a pipeline is that engine's),
    or :class:`ExportRefused` with the first engine rule it breaks."""
    try:
        moved = dataclasses.replace(layout, engine=engine)  # __post_init__: the layout's rules
        moved.check_model(model)
    except SpecError as exc:
        raise refuse(trainer, str(exc)) from None
    return moved


def check_megatron_deepspeed(trainer: str, layout: Layout, model: ModelSpec) -> Layout:
    """Megatron's rules for the model, DeepSpeed's for sharding and the pipeline schedule."""
    if layout.cp > 1:
        # megatron/arguments.py at 4efb479 has no --context-parallel-size: its only sequence
        # split over ranks is DeepSpeed-Ulysses (--ds-sequence-parallel-size, all-to-all over
        # heads), which is not the ring/all-gather context parallelism flm's cp is.
        raise refuse(trainer, f"cp {layout.cp}: Megatron-DeepSpeed has no context parallelism "
                     "(no --context-parallel-size; its --ds-sequence-parallel-size is "
                     "DeepSpeed-Ulysses' all-to-all over heads, not a ring/all-gather K/V "
                     "exchange); use --to megatron-lm or torchtitan")
    problems = [m for rule, m in RULES[Engine.MEGATRON].broken(layout, model)
                if rule not in _DEEPSPEED_PART]
    problems += [f"its pipelines run on DeepSpeed's PipelineEngine (GPTModelPipe): {m}"
                 for rule, m in RULES[Engine.DEEPSPEED].broken(layout, model)
                 if rule in _DEEPSPEED_PART]
    if layout.first_stage_layers or layout.last_stage_layers:
        # --decoder-first/last-pipeline-num-layers are Megatron-LM's (megatron/training/
        # arguments.py at 4efb479 has neither); with --deepspeed its GPTModelPipe is split by
        # PipelineModule's partition_method (deepspeed/runtime/pipe/module.py).
        problems.append("given end stages (first_stage_layers / last_stage_layers): its "
                        "pipeline is DeepSpeed's PipelineModule, split by partition_method, "
                        "with no per-stage layer counts (no --decoder-first-pipeline-num-layers)")
    check_mtp(trainer, model, "its GPT model (megatron/model/gpt_model.py at 4efb479) has no "
              "MTP module")
    if problems:
        raise refuse(trainer, problems[0])
    try:
        # The model's own rules (heads, kv_heads and ffn over tp; no empty pipeline chunk) under
        # DeepSpeed's split; an error of the layout's own engine is not this trainer's.
        moved = dataclasses.replace(layout, engine=Engine.MEGATRON)
    except SpecError:
        moved = layout
    try:
        moved.check_model(model)
    except SpecError as exc:
        if exc.field != "engine":
            raise refuse(trainer, str(exc)) from None
    return layout
