"""Training logs of other trainers (Megatron-LM / Megatron-DeepSpeed, torchtitan, DeepSpeed)
read into flm traces: ``flm collect --from-logs`` (docs/trainer-logs.md)."""

from __future__ import annotations

from frontier_llm.trainers.log_reader import Trainer
from frontier_llm.trainers.deepspeed_log import DeepSpeed
from frontier_llm.trainers.megatron_log import Megatron
from frontier_llm.trainers.torchtitan_log import Torchtitan

TRAINERS: dict[str, Trainer] = {t.name: t for t in (Megatron(), Torchtitan(), DeepSpeed())}
