"""Model-state bytes DeepSpeed keeps beyond the ZeRO paper's accounting (docs/costmodel.md).

An fp32 master partition in fp32 training: with ZeRO 1 or 2 DeepSpeed clones each rank's
partition of the parameters into ``single_partition_of_fp32_groups`` whatever the dtype
(``deepspeed/runtime/zero/stage_1_and_2.py``: "the params in single_partition_of_fp32_groups is
cloned and detached from the origin params"); ZeRO-3 clones into ``fp32_partitioned_groups_flat``
too, since the branch that would share an fp32 partition compares a ``torch.device`` with the
string ``current_device_name()`` and is not taken (``stage3.py``; DeepSpeed 0.19, seen on CPU).
In mixed precision the ZeRO accounting (12 bytes of optimizer state per parameter) already
holds that copy. ZeRO-1 builds it even over one DP rank (pp2 x dp1). Measured by ``flm bench
--engine deepspeed`` (tests/test_bench_deepspeed.py): ZeRO 1-3 hold ``4 + 4`` (moments) ``+ 4``
(master) bytes per parameter of their optimizer partition.

Replicated vocabulary under tensor parallelism: DeepSpeed's AutoTP training (the
``tensor_parallel`` config with explicit layer specs: Q, K, V, fc1 column-parallel, out-proj and
fc2 row-parallel) shards only those linear layers; the token embedding and the output head stay
whole on every TP rank, where Megatron's accounting splits them over the vocabulary. Only
without pipelines: with pp > 1 ``flm bench``'s DeepSpeed engine (like Megatron-DeepSpeed) uses
its own vocabulary-parallel embedding and head (``bench/tp_layers.py``), measured equal to the
Megatron accounting with no extra term.
"""

from __future__ import annotations

import numpy as np

from frontier_llm.specs.layout import DType, Engine, PlacementKind

FP32_MASTER_BYTES = 4
HALF_BYTES = 2
# ZeRO-3's bound on gathered parameters: ``stage3_max_live_parameters`` (default 1e9,
# deepspeed/runtime/zero/config.py ``DeepSpeedZeroConfig.max_live_parameters``, DeepSpeed 0.19):
# the parameter coordinator prefetches only while fewer are available
# (partitioned_param_coordinator.py ``fetch_sub_module``), the module in use is fetched
# whatever its size.
MAX_LIVE_PARAMS = 1_000_000_000


def grad_bytes_per_param(t, per_grad: np.ndarray) -> np.ndarray:
    """Bytes per gradient element a rank keeps (``t`` a LayoutTable; ``per_grad`` the
    engine-neutral count, 4 in 16-bit training: Megatron's fp32 main-gradient buffers,
    ``--accumulate-allreduce-grads-in-fp32``). DeepSpeed's fp16 ZeRO optimizer keeps the
    gradients in the model's fp16 (``param.grad``) and casts only the rank's partition to fp32
    at the step (``deepspeed/runtime/zero/stage_1_and_2.py``: ``get_flat_partition(...,
    dtype=self.single_partition_of_fp32_groups[i].dtype)`` builds the fp32 gradient of the
    partition in ``step``; without ZeRO, ``deepspeed/runtime/fp16/fused_optimizer.py`` flattens
    the fp16 gradients into the fp32 master's gradient in ``step`` likewise), so fp16 under
    DeepSpeed holds 2 bytes per gradient at the start of backward, the peak this model takes."""
    fp16_deepspeed = (t.engine == Engine.DEEPSPEED.code) & (t.dtype == DType.FP16.code)
    return np.where(fp16_deepspeed, HALF_BYTES, per_grad)


def extra_optimizer_bytes(t, params_per_rank: np.ndarray) -> np.ndarray:
    """Bytes DeepSpeed adds to a rank's optimizer state (``t`` a LayoutTable)."""
    optim_degree = t.degree("optim")
    deepspeed = (t.engine == Engine.DEEPSPEED.code) & (t.dtype == DType.FP32.code)
    # Any ZeRO stage >= 1 builds the ZeRO optimizer and its copy, even over one DP rank.
    zero = t.optim_kind != PlacementKind.REPLICATE.code
    return np.where(deepspeed & zero,
                    -(-params_per_rank // optim_degree) * FP32_MASTER_BYTES, 0)


def extra_params(model, t, pp_rank) -> np.ndarray:
    """Parameters a DeepSpeed rank holds beyond ``stage_params_per_rank``: the vocabulary
    rows AutoTP leaves unsplit (embedding on the first stage, an untied head on the last)."""
    tp, pp, r = np.asarray(t.tp), np.asarray(t.pp), np.asarray(pp_rank)
    rows = (model.vocab - (-(-model.vocab // tp))) * model.hidden
    separate = (not model.tied_embeddings) | (pp > 1)
    n = np.where(r == 0, rows, 0) + np.where((r == pp - 1) & separate, rows, 0)
    # AutoTP is what tensor parallelism means without pipelines; with pp > 1 TP is
    # Megatron-DeepSpeed's layers (flm bench's too: bench/tp_layers.py), whose embedding and
    # head are vocabulary-parallel.
    return np.where((t.engine == Engine.DEEPSPEED.code) & (tp > 1) & (pp == 1), n, 0)


def extra_param_bytes(t, params_per_rank: np.ndarray, bytes_per_param: np.ndarray) -> np.ndarray:
    """ZeRO++ hpZ (``p=partial:K,g=full,o=full``): DeepSpeed keeps the primary ZeRO-3 shard over
    all ``dp`` ranks (``ds_tensor``) beside the secondary one over ``K`` ranks
    (``ds_secondary_tensor``), which the AMSP placement counts alone. Measured: dp4, K 2."""
    hpz = ((t.engine == Engine.DEEPSPEED.code) & (t.params_kind == PlacementKind.PARTIAL.code)
           & (t.grads_kind == PlacementKind.FULL.code))
    return np.where(hpz, -(-params_per_rank // t.dp) * bytes_per_param, 0)


def zero3_live_params(model, t, n_layer: np.ndarray, held: np.ndarray,
                      prefetch_bucket: np.ndarray) -> np.ndarray:
    """Parameters DeepSpeed ZeRO-3 holds gathered at once: the layers in use and prefetched
    (``held`` of ``n_layer`` each), but no more than :data:`MAX_LIVE_PARAMS` or the largest
    module (one linear layer, fetched module by module: ``fetch_sub_module``) plus the prefetch
    bucket (``stage3_prefetch_bucket_size``). At 530B (h 20480) that is 1.7e9 parameters, not
    two whole 5e9-parameter layers."""
    f = model.expert_ffn_hidden if model.is_moe else model.ffn_hidden
    largest = np.maximum(model.hidden * (model.q_dim + 2 * model.kv_dim), model.hidden * f)
    largest = largest // np.asarray(t.tp)
    cap = np.maximum(MAX_LIVE_PARAMS, largest) + prefetch_bucket
    return np.minimum(held * n_layer, cap)
