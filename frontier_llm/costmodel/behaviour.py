"""Each engine's scheduling behaviour as numpy arrays indexed by the layout table's ``engine``
codes, read from the one place that states it (``specs/engine_rules.py``, with sources there).

``BEHAVIOUR["prefetch"][t.engine]`` is the prefetch depth of every layout in table ``t``.
"""

from __future__ import annotations

import numpy as np

from frontier_llm.specs.engine_rules import RULES, check_cp_exchange
from frontier_llm.specs.layout import DType, Engine, PlacementKind

FIELDS = ("prefetch", "prefetch_bucket_params", "gather_per_module", "reduce_bucket_params",
          "reshard_after_forward", "gradient_bucketing", "tp_comm_overlap",
          "reduce_fp32", "fused_elementwise", "replicated_grad_overlap",
          "sharded_grad_each_microbatch", "sharded_grad_all_reduce", "param_gather_overlap",
          "fsdp_grad_sync_each_microbatch", "cp_exchange")


def _arrays() -> dict[str, np.ndarray]:
    members = [Engine.from_code(c) for c in range(len(Engine.words()))]
    return {f: np.array([getattr(RULES[e], f) for e in members]) for f in FIELDS}


BEHAVIOUR = _arrays()


def behaviour(t, name: str) -> np.ndarray:
    """One behaviour field for every layout of table ``t`` (by its engine column)."""
    return BEHAVIOUR[name][t.engine]


def bf16_optimizer(t) -> np.ndarray:
    """Whether DeepSpeed itself picks BF16_Optimizer for each layout of table ``t``, as flm's
    DeepSpeed and Megatron-DeepSpeed exports configure it (trainers/deepspeed_config.py: ZeRO
    stage from the sharding, no ``data_types.grad_accum_dtype``, so the accumulation dtype is the
    model's). DeepSpeed 0.19.8 runtime/engine.py ``_do_optimizer_sanity_check``: without ZeRO,
    ``elif model_dtype == grad_accum_dtype: ... if model_dtype == torch.bfloat16 and
    self.pipeline_parallelism: ... return BFLOAT16``; with ZeRO-1 it returns BFLOAT16 only when
    ``grad_accum_dtype == torch.float32`` (not flm's default), else ZERO_OPTIMIZATION (bf16
    accumulation in ``.grad``). So: DeepSpeed, bf16, pp > 1, ZeRO stage 0 (nothing sharded; the
    kinds, not the degrees, since ZeRO-1 over one rank is still the ZeRO optimizer)."""
    zero0 = ((t.params_kind == PlacementKind.REPLICATE.code)
             & (t.grads_kind == PlacementKind.REPLICATE.code)
             & (t.optim_kind == PlacementKind.REPLICATE.code))
    return ((t.engine == Engine.DEEPSPEED.code) & (t.dtype == DType.BF16.code)
            & (np.asarray(t.pp) > 1) & zero0)


def reduces_fp32(t, reduce_fp32: bool | None = None) -> np.ndarray:
    """Whether each layout's 16-bit gradients are accumulated and reduced in fp32: ``reduce_fp32``
    where the run states it (a calibration row, the API), else the engine's rule. For DeepSpeed
    that is the training dtype, BF16_Optimizer (:func:`bf16_optimizer`) included: its
    accumulator is ``grad_acc_dtype`` (runtime/bf16_optimizer.py l.191, DeepSpeed 0.19.8), the
    model's dtype unless the config sets ``data_types.grad_accum_dtype`` (runtime/engine.py
    ``get_data_types``, l.1799-1810; flm's exports leave it unset), and the engine all-reduces it
    cast to ``communication_data_type`` (``allreduce_bucket``, l.3795-3821), bf16 for a bf16 run
    when unset (l.1719-1730). The pipe engine's "hardcoded for fp32 gradient accumulation"
    (runtime/pipe/engine.py l.84) dates from the 2022-2023 optimizer, whose accumulator was
    ``dtype=torch.float32``: runs of that era state it (planner/calibration.py
    ``row_reduce_fp32``)."""
    if reduce_fp32 is not None:
        return np.full(len(t), bool(reduce_fp32))
    return behaviour(t, "reduce_fp32")


def cp_ring(t, cp_exchange: str | None = None) -> np.ndarray:
    """Whether each layout's context parallelism is PyTorch's ``context_parallel`` ring (native
    layouts with cp > 1 whose exchange, ``cp_exchange`` or else the engine's rule, is "ring");
    False for flm bench's single gather, for Megatron's ring (its engine's own) and at cp 1.
    specs/engine_rules.py ``CP_EXCHANGE``."""
    rule = behaviour(t, "cp_exchange")
    setting = rule if check_cp_exchange(cp_exchange) is None else np.full(len(t), cp_exchange)
    return (t.engine == Engine.NATIVE.code) & (np.asarray(t.cp) > 1) & (setting == "ring")


def cp_gather(t, cp_exchange: str | None = None) -> np.ndarray:
    """Whether each layout's context parallelism is flm bench's single K/V all-gather (native,
    cp > 1, not :func:`cp_ring`)."""
    native = (t.engine == Engine.NATIVE.code) & (np.asarray(t.cp) > 1)
    return native & ~cp_ring(t, cp_exchange)
