"""Pipeline stages and schedules (``torch.distributed.pipelining``).

Which chunks a pipeline rank holds and which layers each chunk gets are the layout's
(``Layout.rank_chunks``, ``Layout.chunk_layer_ids``: the engine's split, specs/pipeline_split.py).
Global stage 0 holds the embeddings, the last global stage the final norm and the output head.
"""

from __future__ import annotations

import torch
from torch import nn

from frontier_llm.specs.layout import Schedule
from frontier_llm.specs.model import ModelSpec


def stage_io(stage: int, num_stages: int, micro_batch: int, seq_local: int, spec: ModelSpec,
             dtype: torch.dtype, tp: int = 1, seq_tokens: int | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, output) of a stage for one micro-batch, as meta tensors.

    ``seq_local`` is the hidden states' sequence length a stage passes on, ``seq_tokens`` the
    tokens (and logits) per sequence this rank holds: ``seq_len / cp`` under context
    parallelism (default: the model's ``seq_len``).

    Given to ``PipelineStage`` up front, they let it skip its runtime shape inference, which
    runs an extra forward on the first step and keeps that forward's graph alive for the
    rest of the run (one micro-batch of saved activations on the first stage).
    """
    # requires_grad marks what carries a gradient back to the previous stage.
    hidden = torch.empty(micro_batch, seq_local, spec.hidden, dtype=dtype, device="meta",
                         requires_grad=True)
    seq = spec.seq_len if seq_tokens is None else seq_tokens
    tokens = torch.empty(micro_batch, seq, dtype=torch.long, device="meta")
    # Under TP each rank's head produces its vocab/tp slice of the logits.
    logits = torch.empty(micro_batch, seq, spec.vocab // tp, dtype=dtype, device="meta",
                         requires_grad=True)
    return (tokens if stage == 0 else hidden), (logits if stage == num_stages - 1 else hidden)


def build_schedule(name: str, modules: list[nn.Module], stage_indices: list[int],
                   num_stages: int, n_microbatches: int, loss_fn, device, group,
                   io: list[tuple[torch.Tensor, torch.Tensor]] | None = None):
    """The schedule object for this rank's stage modules (``io``: per-stage meta shapes)."""
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    io = io or [(None, None)] * len(modules)
    stages = [PipelineStage(m, i, num_stages, device, input_args=x, output_args=y, group=group)
              for m, i, (x, y) in zip(modules, stage_indices, io, strict=True)]
    if name == Schedule.INTERLEAVED:
        return ScheduleInterleaved1F1B(stages, n_microbatches=n_microbatches, loss_fn=loss_fn)
    cls = {Schedule.GPIPE: ScheduleGPipe, Schedule.ONE_F_ONE_B: Schedule1F1B}[name]
    return cls(stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn)
