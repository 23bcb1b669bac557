"""Training batches: synthetic tokens from a seed (default) or a memory-mapped token file.

Every rank derives the whole global batch of a step from (seed, step) and keeps its data-parallel
slice, so no rank needs to send data to another and every layout sees exactly the batch the
single-process reference sees.

The synthetic sequences are arithmetic progressions modulo the vocabulary (random start and
stride per sequence): learnable, so the loss falls within a few steps and a wrong gradient shows
up in the loss curve, unlike uniform noise whose loss sits at log(V) whatever the gradient.

Context parallelism (``cp`` > 1) then cuts each sequence of the slice into 2·cp equal chunks and
gives cp rank r chunks r and 2·cp-1-r (:func:`cp_shard`): under a causal mask the early chunks
attend to little and the late ones to much, so pairing the i-th with the i-th-from-last gives
every rank the same attention work (Megatron-LM's context parallelism, Llama 3 §3.3.2,
torchtitan's load-balanced split). Targets are cut the same way, so each rank's loss covers its
own tokens' next-token predictions.

A token file is raw little-endian token ids (uint16 when the vocabulary fits, else uint32, the
nanoGPT ``.bin`` convention); a step's sequences start at offsets drawn from (seed, step).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from frontier_llm.errors import UserError


def token_dtype(vocab: int) -> np.dtype:
    return np.dtype("<u2") if vocab <= 2**16 else np.dtype("<u4")


class TokenSource:
    """Global batches of ``global_batch`` sequences of ``seq_len + 1`` token ids per step."""

    def __init__(self, vocab: int, seq_len: int, seed: int, path: str | Path | None = None):
        self.vocab, self.seq_len, self.seed = vocab, seq_len, seed
        self.tokens = None
        if path is not None:
            path = Path(path)
            if not path.is_file():
                raise UserError(f"--data: token file {path} does not exist")
            dtype = token_dtype(vocab)
            if path.stat().st_size < dtype.itemsize * (seq_len + 1):
                raise UserError(
                    f"--data: {path} holds fewer than seq_len + 1 = {seq_len + 1} tokens "
                    f"of {dtype.itemsize} bytes"
                )
            self.tokens = np.memmap(path, dtype=dtype, mode="r")

    def _generator(self, step: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed * 100_003 + step)

    def global_batch(self, step: int, global_batch: int) -> torch.Tensor:
        """(global_batch, seq_len + 1) int64 token ids for ``step`` (CPU)."""
        gen = self._generator(step)
        n = self.seq_len + 1
        if self.tokens is None:
            start = torch.randint(0, self.vocab, (global_batch, 1), generator=gen)
            stride = torch.randint(1, 8, (global_batch, 1), generator=gen)
            return (start + stride * torch.arange(n)) % self.vocab
        offsets = torch.randint(0, len(self.tokens) - n + 1, (global_batch,), generator=gen)
        rows = np.stack([np.asarray(self.tokens[o:o + n]) for o in offsets.tolist()])
        batch = torch.from_numpy(rows.astype(np.int64))
        if int(batch.max()) >= self.vocab:
            raise UserError(
                f"--data: token id {int(batch.max())} is outside the model's vocabulary "
                f"({self.vocab})"
            )
        return batch

    def rank_batch(self, step: int, global_batch: int, dp: int, dp_rank: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """This data-parallel rank's (inputs, targets), each (global_batch/dp, seq_len)."""
        batch = self.global_batch(step, global_batch).chunk(dp, dim=0)[dp_rank]
        return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()


def cp_positions(seq_len: int, cp: int, cp_rank: int) -> tuple[range, range]:
    """The global positions of cp rank ``cp_rank``'s tokens: chunks r and 2·cp-1-r of 2·cp."""
    c = seq_len // (2 * cp)
    late = 2 * cp - 1 - cp_rank
    return range(cp_rank * c, (cp_rank + 1) * c), range(late * c, (late + 1) * c)


def cp_shard(x: torch.Tensor, cp: int, cp_rank: int, dim: int = 1) -> torch.Tensor:
    """``x``'s share along ``dim`` (the sequence) for cp rank ``cp_rank``, in the order of
    :func:`cp_positions` (identity at cp 1)."""
    if cp == 1:
        return x
    chunks = x.chunk(2 * cp, dim=dim)
    return torch.cat((chunks[cp_rank], chunks[2 * cp - 1 - cp_rank]), dim=dim).contiguous()


def write_token_file(path: str | Path, tokens: np.ndarray, vocab: int) -> Path:
    """Write ``tokens`` in the format :class:`TokenSource` reads (for tests and data prep)."""
    path = Path(path)
    np.asarray(tokens).astype(token_dtype(vocab)).tofile(path)
    return path
