"""Pipeline stages and schedules (``torch.distributed.pipelining``).

Layers are split into ``pp x v`` equal chunks (Narayanan et al. 2021, interleaved schedule): chunk
``c`` of pipeline rank ``r`` is global stage ``c·pp + r``. Global stage 0 holds the embeddings,
the last global stage the final norm and the output head.
"""

from __future__ import annotations

from torch import nn

from frontier_llm.specs.model import ModelSpec

SCHEDULES = ("gpipe", "1f1b", "interleaved")


def stage_ids(pp: int, virtual_stages: int, pp_rank: int) -> list[int]:
    """Global stage indices held by ``pp_rank``, in execution order."""
    return [c * pp + pp_rank for c in range(virtual_stages)]


def stage_layers(spec: ModelSpec, num_stages: int, stage: int) -> list[int]:
    per = spec.layers // num_stages
    return list(range(stage * per, (stage + 1) * per))


def build_schedule(name: str, modules: list[nn.Module], stage_indices: list[int],
                   num_stages: int, n_microbatches: int, loss_fn, device, group):
    """The schedule object for this rank's stage modules."""
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    stages = [PipelineStage(m, i, num_stages, device, group=group)
              for m, i in zip(modules, stage_indices, strict=True)]
    if name == "interleaved":
        return ScheduleInterleaved1F1B(stages, n_microbatches=n_microbatches, loss_fn=loss_fn)
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[name]
    return cls(stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn)
