"""Training logs of other trainers (Megatron-LM / Megatron-DeepSpeed, torchtitan, DeepSpeed)
read into flm traces: ``flm collect --from-logs`` (docs/trainer-logs.md)."""

from __future__ import annotations

from frontier_llm.logs.common import Trainer
from frontier_llm.logs.deepspeed import DeepSpeed
from frontier_llm.logs.megatron import Megatron
from frontier_llm.logs.torchtitan import Torchtitan

TRAINERS: dict[str, Trainer] = {t.name: t for t in (Megatron(), Torchtitan(), DeepSpeed())}
