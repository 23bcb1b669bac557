"""The layout's mesh axes: one vocabulary of parallel degrees and all arithmetic on them.

A layout splits its GPUs over named axes, each a degree of the layout (a ``Layout`` field):
tensor (``tp``), context (``cp``), pipeline (``pp``) and data (``dp``) parallelism. Everything
that multiplies degrees or names a degree's rank asks this module: the world size, the
model-parallel size, the ranks that share parameters, the data-parallel degree for a GPU count,
a frame's world size, a rank's mesh coordinates, and the names derived from the axes (trace
and store rank fields, label pieces, always-shown columns). A new degree is one member of
:class:`Axis` and its place in :data:`MESH_ORDER` (or, for one that re-folds other degrees'
ranks as expert parallelism does, in :data:`FOLDED_AXES`); its consumers follow.

Expert parallelism (``ep``) adds no GPUs: a Mixture-of-Experts block's routed experts are split
over ep ranks taken from the ranks that hold the same dense parameters (dp x cp). Megatron-Core
re-folds each pipeline stage's tp x cp x dp ranks into expert-tp x ep x expert-dp
(megatron/core/parallel_state.py, core_r0.12.0: ``expert_data_parallel_size = world //
(expert_tensor_parallel_size x expert_model_parallel_size x pp)``, its expert RankGenerator's
order ``tp-ep-dp-pp``); torchtitan borrows ep from dp_shard x cp (torchtitan
torchtitan/distributed/parallel_dims.py, v0.2.2). Both keep expert-tp = tp by default, as here.

Expert tensor parallelism (``etp``, Megatron-LM's ``--expert-tensor-parallel-size``) is the
experts' own tensor-parallel degree, folded like ep: a pipeline stage's tp x cp x dp ranks are
renumbered etp x ep x edp for the MoE MLPs (Megatron-Core's "MoE parallel folding"), so
``edp = tp x cp x dp / (etp x ep)`` and etp x ep must divide tp x cp x dp
(megatron/core/parallel_state.py ``initialize_model_parallel``, NVIDIA/Megatron-LM
d98e8a64ddf34856e74b24714e3bedb2f5a39553: ``expert_data_parallel_size = world_size //
(expert_tensor_parallel_size x expert_model_parallel_size x pp)``, its expert RankGenerator's
order ``tp-ep-dp-pp`` with tp = etp; torchtitan v0.2.2 (73a0e6979dd10b6b1904098eb3c8f62c18ab87ce)
distributed/parallel_dims.py ``efsdp = fsdp x tp // (etp x ep)``, mesh ``pp, dp_replicate,
efsdp, ep, etp``). A layout stores etp 0 for "the same as tp" (both trainers' default: Megatron's
``expert_tensor_parallel_size = None`` becomes tp in megatron/training/arguments.py), so every
layout from before etp keeps its key; :func:`expert_tensor_parallel` reads the degree.

The functions take any holder of degrees: a ``Layout`` or the cost model's ``LayoutTable``
(attributes; numpy columns multiply element-wise), a mapping, a pandas row or frame (keys). A
degree the holder lacks is 1: a frame or a trace from before the degree existed ran without it.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any

__all__ = [
    "AXES",
    "EXPERT_TP",
    "FOLDED_AXES",
    "LABELLED",
    "MESH_ORDER",
    "MODEL_AXES",
    "RANK_FIELDS",
    "REPLICA_AXES",
    "SEQUENCE_AXES",
    "WORLD_AXES",
    "Axis",
    "coords",
    "data_parallel_for",
    "degree",
    "expert_data_parallel",
    "expert_stride",
    "expert_tensor_parallel",
    "frame_world_size",
    "label_parts",
    "model_parallel_size",
    "rank_field",
    "rank_fields",
    "rank_of",
    "rank_stride",
    "sequence_split",
    "shard_ranks",
    "world_size",
]


class Axis(StrEnum):
    """A parallel degree: its word is the ``Layout`` field, the CLI flag and the column name.
    Members in the layout's field order (the order of labels and columns); append new ones."""

    TP = "tp"
    CP = "cp"
    PP = "pp"
    DP = "dp"
    EP = "ep"


AXES: tuple[Axis, ...] = tuple(Axis)
# Axes that re-fold the ranks of others rather than multiply the GPU count.
FOLDED_AXES: tuple[Axis, ...] = (Axis.EP,)
# The axes whose degrees multiply to the GPU count.
WORLD_AXES: tuple[Axis, ...] = tuple(a for a in AXES if a not in FOLDED_AXES)

# How ranks are numbered, outermost first: tensor parallelism innermost (its ranks consecutive,
# inside a node: Narayanan et al. 2021), context parallelism next, then data, pipeline stages
# outermost. This is flm bench's DeviceMesh (bench/mesh.py: pp, dp_replicate, dp_shard, cp, tp),
# torchtitan's ParallelDims order (pp, dp_replicate, dp_shard, cp, tp; torchtitan
# torchtitan/distributed/parallel_dims.py, v0.2.2) and Megatron-LM's default ``tp-cp-ep-dp-pp``
# read innermost first (megatron/core/parallel_state.py, core_r0.12.0), with DeepSpeed's
# PipeModelDataParallelTopology (pipe, data, model) the cp = 1 case of it. Expert parallelism
# is not in it: its ranks are the consecutive runs of the dp x cp index (cp fastest), which is
# where Megatron's tp-cp-ep-dp-pp order places ep (see :func:`coords`).
MESH_ORDER: tuple[Axis, ...] = (Axis.PP, Axis.DP, Axis.CP, Axis.TP)

# The ranks that hold the same parameters and see different tokens: gradients are reduced and
# sharded model state spread over them (torchtitan's dp_shard_cp, Megatron's
# data-parallel-with-context group).
REPLICA_AXES: tuple[Axis, ...] = (Axis.DP, Axis.CP)
# Every world axis but data parallelism: the GPUs one model replica spans.
MODEL_AXES: tuple[Axis, ...] = tuple(a for a in WORLD_AXES if a is not Axis.DP)
# The ranks one sequence's tokens are split over when sequence parallelism is on: context
# parallelism splits the sequence, tensor parallelism's sequence-parallel regions split each
# chunk again (Korthikanti et al. 2022; torchtitan's seq_len_divisor is tp x 2cp).
SEQUENCE_AXES: tuple[Axis, ...] = (Axis.TP, Axis.CP)
# The degrees every label and every table of layouts shows, even at 1: those of the 3-D layout
# (tp8 pp4 dp2). A later degree is shown where it is not 1 (tp8 cp2 pp4 dp2), so labels and
# job keys of layouts without it stay as they were.
LABELLED: tuple[Axis, ...] = (Axis.TP, Axis.PP, Axis.DP)

assert sorted(MESH_ORDER) == sorted(WORLD_AXES), "MESH_ORDER must place every world axis once"


def rank_field(axis: Axis | str) -> str:
    """The trace's and the store's name for a rank's index along ``axis``: ``tp_rank``,
    ``cp_rank``, ``dp_rank``; the pipeline's is ``pp_stage`` (the trace schema's name since
    its first version: old traces and databases keep it)."""
    axis = Axis(axis)
    return "pp_stage" if axis is Axis.PP else f"{axis}_rank"


RANK_FIELDS: tuple[str, ...] = tuple(rank_field(a) for a in AXES)


def degree(holder: Any, axis: Axis | str) -> Any:
    """``holder``'s degree along ``axis`` (1 where it has none); a column stays a column."""
    name = str(axis)
    if hasattr(holder, "keys"):  # a mapping, a pandas row or frame
        if name not in holder:
            return 1
        value = holder[name]
        # A frame's column that predates the degree is empty in old rows: they ran at 1.
        if hasattr(value, "fillna"):
            return value.fillna(1)
        return 1 if isinstance(value, float) and math.isnan(value) else value
    return getattr(holder, name, 1)


def _product(holder: Any, axes: tuple[Axis, ...]) -> Any:
    return math.prod((degree(holder, a) for a in axes), start=1)


def world_size(holder: Any) -> Any:
    """GPUs (ranks) of a layout: the product of every world degree (ep re-folds them)."""
    return _product(holder, WORLD_AXES)


def rank_stride(holder: Any, axis: Axis | str) -> Any:
    """How many ranks apart two neighbours along ``axis`` are: the product of the degrees
    numbered inside it (MESH_ORDER). Pipeline neighbours are tp x cp x dp ranks apart."""
    inner = MESH_ORDER[MESH_ORDER.index(Axis(axis)) + 1:]
    return _product(holder, inner)


def model_parallel_size(holder: Any) -> Any:
    """GPUs one model replica spans: the product of every degree but dp."""
    return _product(holder, MODEL_AXES)


def shard_ranks(holder: Any) -> Any:
    """Ranks that hold the same parameters and share their gradients and sharded state."""
    return _product(holder, REPLICA_AXES)


# The experts' tensor-parallel degree's field: not an :class:`Axis` (it names no rank field of
# its own in traces and the store), a folded degree whose 0 means "tp" (module docstring).
EXPERT_TP = "etp"


def _expert_tp_field(holder: Any) -> Any:
    """The holder's stored etp, 0 ("tp") where it has none: unlike a world degree, a holder
    from before etp ran its experts at tp, not at 1."""
    if hasattr(holder, "keys"):
        if EXPERT_TP not in holder:
            return 0
        value = holder[EXPERT_TP]
        if hasattr(value, "fillna"):
            return value.fillna(0)
        return 0 if value is None or (isinstance(value, float) and math.isnan(value)) else value
    return getattr(holder, EXPERT_TP, 0)


def expert_tensor_parallel(holder: Any) -> Any:
    """The experts' tensor-parallel degree: the holder's ``etp``, or tp where it has none or
    stores 0 (the default: expert-tp = tp). A column stays a column."""
    etp, tp = _expert_tp_field(holder), degree(holder, Axis.TP)
    if hasattr(etp, "__len__") or hasattr(tp, "__len__"):
        import numpy as np

        return np.where(np.asarray(etp) == 0, tp, etp)
    return tp if etp == 0 else etp


def expert_data_parallel(holder: Any) -> Any:
    """Ranks that hold the same routed experts and reduce their gradients: tp x cp x dp /
    (etp x ep) (Megatron-Core's expert data parallel; dp x cp / ep with etp = tp). A column
    stays a column."""
    ranks = shard_ranks(holder) * degree(holder, Axis.TP)
    return ranks // (expert_tensor_parallel(holder) * degree(holder, Axis.EP))


def expert_stride(holder: Any) -> Any:
    """How many ranks apart two members of an expert-parallel group are: etp (Megatron's
    expert order ``tp-ep-dp-pp`` with tp = etp, torchtitan's ``..., ep, etp`` mesh). With etp
    = tp that is tp, the dense order's ``tp-cp-ep-dp-pp``; with etp 1 under tp 4 the group is
    consecutive ranks and may span the tp ranks."""
    return expert_tensor_parallel(holder)


def fewest_data_parallel_for_ep(ep: int, cp: int = 1) -> int:
    """The smallest dp whose dp x cp ranks ep divides (ep re-folds them): ep / gcd(ep, cp)."""
    return ep // math.gcd(ep, cp)


def sequence_split(holder: Any) -> Any:
    """Ranks one sequence's tokens are split over with sequence parallelism (tp x cp)."""
    return _product(holder, SEQUENCE_AXES)


def data_parallel_for(gpus: int, holder: Any) -> int | None:
    """The data-parallel degree that fills ``gpus`` with ``holder``'s other degrees (its dp, if
    any, is ignored); None where their product does not divide ``gpus``."""
    per_replica = int(model_parallel_size(holder))
    return gpus // per_replica if gpus % per_replica == 0 else None


def frame_world_size(frame: Any) -> Any:
    """:func:`world_size` of every row of a frame (a numpy array; a missing or empty degree
    column counts 1)."""
    import numpy as np

    return np.asarray(world_size(frame), dtype=float) * np.ones(len(frame))


def coords(rank: int, holder: Any) -> dict[str, int]:
    """Rank ``rank``'s index along each axis (row-major over :data:`MESH_ORDER`); its expert-
    parallel index is its place in the folded expert order (etp fastest, then ep) of the
    rank's index inside its pipeline stage; with etp = tp, a run of ep consecutive dp x cp
    indices (cp fastest)."""
    if not 0 <= rank < world_size(holder):
        raise ValueError(f"rank {rank} is outside a world of {world_size(holder)} ranks")
    out = {}
    for axis in reversed(MESH_ORDER):
        size = int(degree(holder, axis))
        out[str(axis)] = rank % size
        rank //= size
    in_stage = (out["dp"] * int(degree(holder, Axis.CP)) + out["cp"]) * int(
        degree(holder, Axis.TP)) + out["tp"]
    out["ep"] = in_stage // int(expert_tensor_parallel(holder)) % int(degree(holder, Axis.EP))
    return {str(a): out[str(a)] for a in AXES}


def rank_of(index: dict[str, int], holder: Any) -> int:
    """The rank at mesh coordinates ``index`` (axis -> index; an axis left out is 0; a folded
    axis's index is implied by the others and ignored)."""
    rank = 0
    for axis in MESH_ORDER:
        rank = rank * int(degree(holder, axis)) + int(index.get(str(axis), 0))
    return rank


def rank_fields(index: dict[str, int]) -> dict[str, int]:
    """A rank's trace fields from its coordinates: ``{"tp_rank": 0, "cp_rank": 1, ...}`` (an
    axis the coordinates lack is index 0: the rank ran before that degree, at 1)."""
    return {rank_field(a): int(index.get(str(a), 0)) for a in AXES}


def label_parts(values: Any, omit: Any = ()) -> list[str]:
    """The degrees' pieces of a layout's label, in axis order: ``tp8``, ``pp4``, ``dp2``
    always, a later degree where it is not 1 (``tp8 cp2 pp4 dp2``); ``omit``: axes left out."""
    parts = [f"{a}{degree(values, a)}" for a in AXES
             if a not in omit and (a in LABELLED or str(degree(values, a)) != "1")]
    etp = _expert_tp_field(values)
    if EXPERT_TP not in omit and str(etp) not in ("0", "0.0") and str(etp) != str(
            degree(values, Axis.TP)):
        parts.append(f"{EXPERT_TP}{etp}")  # set apart from tp: tp4 pp8 dp4 ep8 etp1
    return parts
