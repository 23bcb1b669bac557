"""``flm bench --engine deepspeed``'s ds_config: the DeepSpeed trainer's own builder
(``frontier_llm/trainers/deepspeed_config.py``), which the export adapts to a user's model.

The builder sits in ``trainers/`` (below ``bench/`` in .importlinter's layers) so that one
function writes every ds_config flm makes: flm bench's engine and ``flm export --to deepspeed``
/ ``megatron-deepspeed`` cannot drift apart.
"""

from __future__ import annotations

from frontier_llm.trainers.deepspeed_config import (
    AUTOTP_LAYER_SPECS,
    DEFAULT_BUCKET_MB,
    bucket_elements,
    deepspeed_config,
    zero_settings,
)

__all__ = ["AUTOTP_LAYER_SPECS", "DEFAULT_BUCKET_MB", "bucket_elements", "deepspeed_config",
           "zero_settings"]
