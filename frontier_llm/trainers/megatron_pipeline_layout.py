"""Megatron-LM's ``--pipeline-model-parallel-layout`` string, read for what a log states.

Megatron-Core (``PipelineParallelLayerLayout.parse_str_to_list``,
megatron/core/transformer/pipeline_parallel_layer_layout.py at 309ffca) reads the string as
stages split by ``|``, each a run of layer letters (``E`` embedding, ``t`` decoder layer, ``m``
multi-token-prediction layer, ``L`` loss), with ``(...)*n`` and ``x*n`` repeating and commas
cosmetic; ``pp x vp`` stages in pipeline order (stage ``c·pp + r`` is chunk ``c`` of rank ``r``).
flm states a split by its end stages (``first_stage_layers`` / ``last_stage_layers``,
specs/pipeline_split.py): :func:`given_ends_of` returns them where the string's decoder layers
are such a split, else the reason it is not (the log reader then refuses the run rather than
price another split).
"""

from __future__ import annotations

import re

_GROUP = re.compile(r"\(([^)]+)\)\*(\d+)")
_ONE = re.compile(r"(.)\*(\d+)")
_LETTERS = set("EtmL")


def stages_of(text: str) -> list[str]:
    """The string's stages, unrolled, in pipeline order; ValueError for a letter Megatron does
    not know."""
    flat = text.replace(",", "")
    flat = _GROUP.sub(lambda m: m.group(1) * int(m.group(2)), flat)
    flat = _ONE.sub(lambda m: m.group(1) * int(m.group(2)), flat)
    stages = flat.split("|")
    bad = {c for stage in stages for c in stage} - _LETTERS
    if bad:
        raise ValueError(f"unknown layer letters {sorted(bad)} in {text!r}")
    return stages


def decoder_layers_per_chunk(text: str) -> list[int]:
    """Decoder layers (``t``) of each stage of the string, in pipeline order."""
    return [stage.count("t") for stage in stages_of(text)]


def given_ends_of(text: str, pp: int) -> tuple[int, int] | str:
    """(first_stage_layers, last_stage_layers) of a layout string over ``pp`` ranks (0 where
    that end holds the middle stages' share), or why flm can not state it that way: the middle
    ranks must hold equal counts and every rank's chunks equal shares."""
    stages = stages_of(text)
    chunks = [stage.count("t") for stage in stages]
    if pp < 1 or len(chunks) % pp:
        return f"{len(chunks)} stages are not a multiple of pp {pp}"
    if any("m" in stage for stage in stages[:-1]):
        # flm prices multi-token prediction on the last stage's last chunk only.
        return "multi-token-prediction layers on a stage other than the last"
    ranks = [chunks[r::pp] for r in range(pp)]
    if any(len(set(c)) > 1 for c in ranks):
        return "a pipeline rank's chunks hold different layer counts"
    held = [sum(c) for c in ranks]
    if min(held) < 1:
        return "a pipeline rank without decoder layers (a standalone embedding or loss stage)"
    if pp == 1:
        return 0, 0
    middle = set(held[1:-1])
    if len(middle) > 1:
        return "the middle stages hold different layer counts"
    share = middle.pop() if middle else None
    if share is None:  # pp 2: both ends as they are
        return held[0], held[-1]
    return (0 if held[0] == share else held[0]), (0 if held[-1] == share else held[-1])
