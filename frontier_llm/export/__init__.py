"""Export a layout to another trainer: Megatron-LM and Megatron-DeepSpeed ``pretrain_gpt.py``
flags, torchtitan's job-config TOML, DeepSpeed's ``ds_config.json`` (docs/export.md).

The writers are the trainers' own (``frontier_llm/trainers/``, one module per trainer); this
module is the API over the registry: :func:`export` returns the text, and a trainer that cannot
express the layout raises :class:`ExportRefused` with one line saying why.
"""

from __future__ import annotations

from frontier_llm.costmodel.tp_overlap import TP_OVERLAP_FLAG
from frontier_llm.errors import SpecError
from frontier_llm.specs.layout import Engine, Layout, complete_layout
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec
from frontier_llm.trainers import NAMES, UnknownTrainer, get
from frontier_llm.trainers import TRAINERS as REGISTRY
from frontier_llm.trainers.deepspeed import ds_config, ds_config_text
from frontier_llm.trainers.megatron_common import DEFAULT_DS_CONFIG
from frontier_llm.trainers.refusals import ExportRefused, refuse
from frontier_llm.trainers.torchtitan import job_config

MEGATRON_LM, MEGATRON_DEEPSPEED, TORCHTITAN, DEEPSPEED = (
    "megatron-lm", "megatron-deepspeed", "torchtitan", "deepspeed")
# The trainers' names, in the registry's order (flm export --to's choices).
TRAINERS = NAMES
# The version each trainer's names were read from (docs/export.md cites file and commit).
SOURCES = {t.name: t.source for t in REGISTRY.values()}
# The engines standing for each trainer (specs/engine_rules.py).
TRAINER_ENGINES = {t.name: t.engines for t in REGISTRY.values()}


def _trainer(name: str):
    try:
        return get(name)
    except UnknownTrainer as exc:
        raise ExportRefused(str(exc)) from None


def layout_for(trainer: str, values: dict) -> Layout:
    """A layout from flm's layout options (``given_options``); one that names no engine gets the
    trainer's, and a layout no engine builds is refused with the trainer's engine's rule."""
    t = _trainer(trainer)
    if values.get("global_batch") is None and values.get("pp", 1) > 1:
        # Unstated, the global batch is one micro-batch per data-parallel rank (complete_layout),
        # which leaves a pipeline a single micro-batch: no schedule runs that, so every layout
        # with pp > 1 was refused by that engine rule before the trainer could say what it
        # lacks. One micro-batch per stage is the least every schedule takes.
        values = {**values, "global_batch": values.get("micro_batch", 1) * values.get("dp", 1)
                  * values["pp"]}
    if values.get("engine") is not None:
        return Layout.from_dict(complete_layout(values))
    first: SpecError | None = None
    # Last the native engine, which runs the most: a layout no single flm engine runs (ZeRO-3
    # with sequence parallelism on Megatron-DeepSpeed) is then judged by the exporter's checks.
    for engine in dict.fromkeys((*t.engines, Engine.NATIVE)):
        try:
            return Layout.from_dict(complete_layout({**values, "engine": engine.value}))
        except SpecError as exc:
            first = first or exc
    raise refuse(t.name, str(first))


def header(trainer: str, model: ModelSpec, layout: Layout,
           system: SystemSpec | None = None) -> list[str]:
    """The comment lines above the flags or the TOML: what, for what, from which source."""
    return _trainer(trainer).header(model, layout, system)


def export(trainer: str, model: ModelSpec, layout: Layout, system: SystemSpec | None = None,
           ds_config_path: str = DEFAULT_DS_CONFIG, bucket_mb: float | None = None,
           compiled: bool = True, p2p_overlap: bool = False,
           tp_comm_overlap: bool = False) -> str:
    """The trainer's text for ``layout``: flags, TOML or JSON (JSON has no comments).
    ``bucket_mb``: a tuned gradient bucket (flm tune best), where the trainer takes one;
    ``compiled`` False: the layout was priced eager (flm plan --eager; torchtitan's [compile]);
    ``p2p_overlap``: the layout was priced with its interleaved pipeline sends overlapped
    (``--overlap-p2p-comm on``), refused by a trainer that renders no such setting;
    ``tp_comm_overlap``: priced with Megatron-LM's ``--tp-comm-overlap`` (flm's
    ``--tp-comm-overlap on``), likewise refused by every other trainer."""
    t = _trainer(trainer)
    if p2p_overlap and not t.takes_p2p_overlap:
        raise refuse(t.name, "--overlap-p2p-comm on is Megatron-Core's overlap_p2p_comm of "
                     "Megatron-LM's interleaved schedule; "
                     f"{t.title} has no such setting (export --to megatron-lm)")
    if tp_comm_overlap and not t.takes_tp_overlap:
        raise refuse(t.name, f"{TP_OVERLAP_FLAG} on is Megatron-LM's TransformerEngine TP "
                     f"communication/GEMM overlap; {t.title} has {t.tp_overlap_instead} "
                     "(export --to megatron-lm)")
    return t.export_text(model, layout, system, ds_config_path=ds_config_path,
                         bucket_mb=bucket_mb, compiled=compiled, p2p_overlap=p2p_overlap,
                         tp_comm_overlap=tp_comm_overlap)


def megatron_lm_argv(model: ModelSpec, layout: Layout) -> list[str]:
    """Megatron-LM ``pretrain_gpt.py`` flags."""
    return get(MEGATRON_LM).flags(model, layout)


def megatron_deepspeed_argv(model: ModelSpec, layout: Layout,
                            ds_config_path: str = DEFAULT_DS_CONFIG) -> list[str]:
    """Megatron-DeepSpeed ``pretrain_gpt.py`` flags naming the ds_config at ``ds_config_path``."""
    return get(MEGATRON_DEEPSPEED).flags(model, layout, ds_config_path)


__all__ = ["DEEPSPEED", "MEGATRON_DEEPSPEED", "MEGATRON_LM", "SOURCES", "TORCHTITAN",
           "TRAINERS", "TRAINER_ENGINES", "ExportRefused", "ds_config", "ds_config_text",
           "export", "header", "job_config", "layout_for", "megatron_deepspeed_argv",
           "megatron_lm_argv"]
