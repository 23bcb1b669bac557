"""ModelSpec: the shape of a GPT-style (or Llama-style) decoder-only transformer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from frontier_llm.errors import SpecError
from frontier_llm.specs.values import check_name

# The largest value of any model dimension (2**24 = 16,777,216: vocabularies reach a few hundred
# thousand, contexts a few million tokens): above it a model file holds a typing mistake, and the
# bound keeps every product of dimensions inside int64 and every enumeration over them short.
MAX_DIMENSION = 2**24


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer.

    GPT style (Narayanan et al. 2021): LayerNorm, learned positions, biases, a 4h GeLU MLP.
    Llama style: RMSNorm, rotary positions, no biases, a SwiGLU MLP and grouped-query attention
    (``kv_heads`` < ``heads``).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    kv_heads: int | None = None  # None means multi-head attention (kv_heads == heads)
    ffn_hidden: int | None = None  # None means 4 * hidden
    activation: Literal["gelu", "swiglu"] = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    position: Literal["learned", "rope"] = "learned"
    bias: bool = True
    tied_embeddings: bool = False
    # Dropout probability. Megatron-style GPT training uses 0.1; it adds the dropout masks of
    # Korthikanti et al. 2022 §4.1 to the activation memory. Llama trains without it.
    dropout: float = 0.0
    description: str = ""

    def __post_init__(self) -> None:
        # The name reaches exported flag files, TOML and script comments: one printable line.
        check_name(self.name, "name")
        for name in ("layers", "hidden", "heads", "seq_len", "vocab", "kv_heads", "ffn_hidden"):
            value = getattr(self, name)
            if value is None:
                continue
            if value < 1:
                raise SpecError(f"{name} must be at least 1 (got {value})", name)
            if value > MAX_DIMENSION:
                raise SpecError(f"{name} must be at most {MAX_DIMENSION:,} (got {value})", name)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        if self.hidden % self.heads:
            raise SpecError(
                f"hidden ({self.hidden}) is not divisible by heads ({self.heads})", "hidden"
            )
        if self.kv_heads < 1 or self.heads % self.kv_heads:
            raise SpecError(
                f"heads ({self.heads}) is not divisible by kv_heads ({self.kv_heads})", "kv_heads"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise SpecError(f"dropout must be in [0, 1) (got {self.dropout})", "dropout")
        if self.ffn_hidden < 1:
            raise SpecError(f"ffn_hidden must be at least 1 (got {self.ffn_hidden})", "ffn_hidden")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of width ffn_hidden in the MLP: 2 for GeLU, 3 for SwiGLU."""
        return 3 if self.activation == "swiglu" else 2

    # Parameter counts, split the way pipeline stages and tensor parallelism split them.
    def layer_params(self) -> int:
        """Parameters of one transformer block."""
        h, f, kv = self.hidden, self.ffn_hidden, self.kv_dim
        attn = h * (h + 2 * kv) + h * h
        mlp = self.mlp_matrices * h * f
        norm = 2 * (2 * h if self.norm == "layernorm" else h)
        bias = (h + 2 * kv + h + (f * (self.mlp_matrices - 1)) + h) if self.bias else 0
        return attn + mlp + norm + bias

    def embedding_params(self) -> int:
        """Token embedding plus learned positions (on the first pipeline stage)."""
        pos = self.seq_len * self.hidden if self.position == "learned" else 0
        return self.vocab * self.hidden + pos

    def head_params(self) -> int:
        """Final norm plus the output projection (on the last stage; shared when tied)."""
        norm = 2 * self.hidden if self.norm == "layernorm" else self.hidden
        return norm + (0 if self.tied_embeddings else self.vocab * self.hidden)

    def num_params(self) -> int:
        return self.layers * self.layer_params() + self.embedding_params() + self.head_params()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
