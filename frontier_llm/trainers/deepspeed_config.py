"""The DeepSpeed configuration of a layout: a pure function, never a hand-written file per run.

:func:`deepspeed_config` maps a :class:`Layout` (and the run's ``--bucket-mb``) to the dict
``deepspeed.initialize(config=...)`` takes:

* ``zero_optimization.stage`` from the sharding: zero0..zero3 are DeepSpeed's stages 0..3;
  ZeRO++ hpZ (``p=partial:K,g=full,o=full``: a secondary parameter shard of K ranks gathered in
  backward) is stage 3 with ``zero_hpz_partition_size: K``. MiCS (every component
  ``partial:K``) was ``mics_shard_size``, which DeepSpeed 0.19 removed (its ``runtime/config.py``
  raises ``DeepSpeedConfigError`` for the key, ``_REMOVED_ZERO_CONFIG_KEYS``): refused here with
  that reason;
* ``bf16`` / ``fp16`` (dynamic loss scaling) from the dtype; fp32 is neither;
* ``train_micro_batch_size_per_gpu`` = micro_batch, ``gradient_accumulation_steps`` =
  global_batch / (micro_batch x dp) (the pipeline's micro-batches), ``train_batch_size`` =
  global_batch: DeepSpeed checks the three agree with its data-parallel world size;
* ``overlap_comm`` and ``contiguous_gradients`` on, ``reduce_bucket_size`` /
  ``allgather_bucket_size`` from ``--bucket-mb`` (in elements: DeepSpeed counts elements, not
  bytes), default 64 MiB as the native engine's bucket;
* ``activation_checkpointing`` when the layout recomputes (the model's own ``torch.utils.
  checkpoint`` does the work; the block only records the choice, no partitioning or CPU offload);
* ``tensor_parallel`` (AutoTP training, ``autotp_size`` = tp) with explicit layer specs
  (:data:`AUTOTP_LAYER_SPECS`) when tp > 1 without pipelines. With pipelines AutoTP cannot serve
  (its 2-D (dp, tp) mesh spans the whole world, so pipeline stages land in its data-parallel
  group): the engine builds Megatron-style layers itself (``bench/tp_layers.py``) and
  ``PipelineModule``'s grid is the mpu, so no ``tensor_parallel`` block.

The optimizer is not in the config: the engine passes a torch optimizer, since a config optimizer
makes DeepSpeed JIT-compile FusedAdam (about 50 s on CPU, machine-notes), and
``zero_allow_untested_optimizer`` lets ZeRO wrap it.
"""

from __future__ import annotations

from frontier_llm.errors import UserError
from frontier_llm.specs.layout import DType, Layout, PlacementKind, Recompute

DEFAULT_BUCKET_MB = 64.0
# Each layout setting's ds_config key, and the DeepSpeedConfig attribute the engine's
# "DeepSpeedEngine configuration:" block prints it under (DeepSpeedConfig.print: every
# attribute, sorted, "  name ..... value"; deepspeed/runtime/config.py, DeepSpeed 0.19.8). The
# export writes the keys; the log reader (trainers/deepspeed_log.py) reads the printed names.
GLOBAL_BATCH_KEY = "train_batch_size"
MICRO_BATCH_KEY = "train_micro_batch_size_per_gpu"
PRINTED = {
    GLOBAL_BATCH_KEY: "global_batch", MICRO_BATCH_KEY: "micro_batch",
    "zero_optimization_stage": "sharding",  # zero_optimization.stage
    "tensor_parallel_config": "tp",  # tensor_parallel.autotp_size, printed "autotp_size=N"
    "bfloat16_config": "bf16", "float16_config": "fp16",  # bf16/fp16.enabled: "enabled=True"
}
PRINTED_AS = {setting: printed for printed, setting in PRINTED.items()}
# AutoTP training's explicit layer specs for model.py's names: Megatron's split (Q, K, V, fc1 and
# the SwiGLU gate column-parallel; out-projection and fc2 row-parallel); the rest stays whole.
AUTOTP_LAYER_SPECS = [
    {"patterns": [r".*\.attention\.wo\.weight$", r".*\.feed_forward\.w2\.weight$"],
     "partition_type": "row"},
    {"patterns": [r".*\.attention\.w[qkv]\.weight$", r".*\.feed_forward\.w[13]\.weight$"],
     "partition_type": "column"},
]


def zero_settings(layout: Layout) -> tuple[int, int]:
    """(ZeRO stage, hpZ partition size; 1 = no hpZ) for the layout's sharding."""
    sh = layout.sharding
    stage = sh.zero_stage()
    if stage is not None:
        return stage, 1
    kinds = (sh.params.kind, sh.grads.kind, sh.optim.kind)
    if kinds == (PlacementKind.PARTIAL, PlacementKind.FULL, PlacementKind.FULL):
        return 3, sh.params.group
    if all(k == PlacementKind.PARTIAL for k in kinds):
        raise UserError(
            f"sharding {sh.describe()} is MiCS (mics_shard_size), which DeepSpeed 0.19 removed "
            "(runtime/config.py refuses the key): use the native engine's HSDP for it"
        )
    raise UserError(
        f"sharding {sh.describe()} has no DeepSpeed equivalent: the deepspeed engine runs zero0-"
        "zero3 and ZeRO++ hpZ (p=partial:K,g=full,o=full)"
    )


def bucket_elements(bucket_mb: float | None, dtype: DType) -> int:
    """A bucket of ``bucket_mb`` MiB in elements of the gradients' dtype."""
    # fp8 training keeps bf16 gradients (its GEMMs alone are 8-bit: costmodel/fp8.py).
    size = {DType.FP32: 4, DType.BF16: 2, DType.FP16: 2, DType.FP8: 2}[DType(dtype)]
    return int((bucket_mb or DEFAULT_BUCKET_MB) * 2**20) // size


def deepspeed_config(layout: Layout, bucket_mb: float | None = None) -> dict:
    """The ``deepspeed.initialize`` config for ``layout`` (see the module docstring)."""
    stage, hpz = zero_settings(layout)
    bucket = bucket_elements(bucket_mb, layout.dtype)
    zero: dict = {
        "stage": stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": bucket,
        "allgather_bucket_size": bucket,
    }
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=bucket, stage3_param_persistence_threshold=0)
        if hpz > 1:
            zero["zero_hpz_partition_size"] = hpz
    cfg: dict = {
        GLOBAL_BATCH_KEY: layout.global_batch,
        MICRO_BATCH_KEY: layout.micro_batch,
        "gradient_accumulation_steps": layout.num_microbatches,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": layout.dtype == DType.BF16},
        "fp16": {"enabled": layout.dtype == DType.FP16, "loss_scale": 0,
                 "initial_scale_power": 16},
        "gradient_clipping": 0.0,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if layout.recompute != Recompute.NONE:
        cfg["activation_checkpointing"] = {
            "partition_activations": False, "contiguous_memory_optimization": False,
            "cpu_checkpointing": False, "synchronize_checkpoint_boundary": False,
        }
    if layout.tp > 1 and layout.pp == 1:
        cfg["tensor_parallel"] = {"autotp_size": layout.tp, "partition_config": {
            "use_default_specs": False, "layer_specs": AUTOTP_LAYER_SPECS}}
        # DeepSpeedConfig checks train_batch_size against the whole world (TP ranks included)
        # when no mpu is given; micro-batch x accumulation steps say the same thing.
        del cfg[GLOBAL_BATCH_KEY]
    return cfg
