"""The benchmark's GPT, built from a :class:`ModelSpec` (GPT style or Llama style).

One class serves the single-process reference and every pipeline stage: a stage is the same
model built with only its layers (``layer_ids``) and, on the first stage, the embeddings, on the
last the final norm and the output head. Module names are what the tensor-parallel plan in
``parallelize.py`` refers to (``tok_embeddings``, ``layers.<i>.attention.wq`` ...), and what the
per-parameter initialisation is keyed by, so every layout starts from exactly the same weights as
the reference.

Attention uses ``scaled_dot_product_attention`` (the flash / memory-efficient kernels where the
device has them); ``flash_attention=False`` is the explicit matmul-softmax-matmul path that keeps
the ``s x s`` scores for backward (Korthikanti et al. 2022's ``5·a·s/h`` term).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from frontier_llm.bench.checkpoint_policy import checkpoint_selective_op
from frontier_llm.bench.context_parallel import CPContext
from frontier_llm.bench.moe import MoE, block_runs
from frontier_llm.specs.layout import DType, Recompute
from frontier_llm.specs.model import ModelSpec

INIT_STD = 0.02
# fp8: the model is bf16; its linears multiply in float8 (bench/float8.py, torchao).
DTYPES = {DType.FP32: torch.float32, DType.BF16: torch.bfloat16, DType.FP16: torch.float16,
          DType.FP8: torch.bfloat16}


class _RMSNormFn(torch.autograd.Function):
    """RMSNorm that keeps only its input and the per-token 1/rms for backward, as fused kernels
    (Megatron, Apex, Transformer Engine) do; the composite ``torch.rms_norm`` on CPU keeps a
    second full-size tensor."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, weight)
        return (xf * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, rstd, weight = ctx.saved_tensors
        xhat = x.to(rstd.dtype) * rstd
        g = grad.to(rstd.dtype)
        grad_w = (g * xhat).sum(dim=tuple(range(g.dim() - 1))).to(weight.dtype)
        gx = g * weight.to(rstd.dtype)
        grad_x = rstd * (gx - xhat * (gx * xhat).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_w, None


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNormFn.apply(x, self.weight, self.eps)


def _norm(spec: ModelSpec) -> nn.Module:
    if spec.norm == "rmsnorm":
        return RMSNorm(spec.hidden, eps=1e-5)
    # GPT's LayerNorm always has a bias (ModelSpec counts 2h per norm).
    return nn.LayerNorm(spec.hidden, eps=1e-5)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, rotate-half form (real arithmetic, so DTensor/compile friendly)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


_TABLES: dict = {}


def _rope_tables(seq: int, head_dim: int, device: torch.device, dtype: torch.dtype,
                 theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables, one copy per shape shared by every layer (backward keeps them)."""
    key = (seq, head_dim, device, dtype, theta)
    if key not in _TABLES:
        _TABLES[key] = _make_rope_tables(seq, head_dim, device, dtype, theta)
    return _TABLES[key]


def _cp_rope_tables(cp: CPContext, head_dim: int, device: torch.device, dtype: torch.dtype
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """This cp rank's rows of the whole sequence's cos/sin tables, one copy shared by layers."""
    key = ("cp", cp.seq_len, cp.cp, cp.rank, head_dim, device, dtype)
    if key not in _TABLES:
        cos, sin = _rope_tables(cp.seq_len, head_dim, device, dtype)
        _TABLES[key] = cp.local_rows(cos), cp.local_rows(sin)
    return _TABLES[key]


def _causal_mask(s: int, device: torch.device) -> torch.Tensor:
    key = ("mask", s, device)
    if key not in _TABLES:
        _TABLES[key] = torch.ones(s, s, dtype=torch.bool, device=device).triu(1)
    return _TABLES[key]


def _make_rope_tables(seq: int, head_dim: int, device: torch.device, dtype: torch.dtype,
                      theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32)
                           / head_dim))
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, flash: bool,
                   dropout: float, training: bool, allowed: torch.Tensor | None = None,
                   blocked: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q kᵀ/√d) v, causal; q is (b, heads, s, d), k and v (b, kv_heads, s', d).

    ``allowed`` / ``blocked`` (s, s'): an explicit mask by global positions instead of the square
    causal one (context parallelism: local queries against the gathered sequence); the fused
    path takes ``allowed`` (boolean, or additive 0 / -inf), the explicit path ``blocked``
    (boolean, True where a key is masked).
    """
    p = dropout if training else 0.0
    if flash:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, dropout_p=p, is_causal=allowed is None,
            enable_gqa=q.shape[1] != k.shape[1]
        )
    if q.shape[1] != k.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    mask = _causal_mask(s, q.device) if blocked is None else blocked
    probs = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
    if p:
        probs = F.dropout(probs, p=p, training=True)
    return probs @ v


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, flash: bool, selective_recompute: bool) -> None:
        super().__init__()
        h, kv = spec.hidden, spec.kv_dim
        self.head_dim = spec.head_dim
        self.rope = spec.position == "rope"
        self.flash = flash
        self.selective = selective_recompute
        self.dropout = spec.dropout
        # Separate Q, K, V projections: column-parallel sharding then splits whole heads.
        self.wq = nn.Linear(h, spec.q_dim, bias=spec.bias)
        self.wk = nn.Linear(h, kv, bias=spec.bias)
        self.wv = nn.Linear(h, kv, bias=spec.bias)
        self.wo = nn.Linear(spec.q_dim, h, bias=spec.bias)
        # Context parallelism (bench/context_parallel.py apply_cp): set on cp > 1 only.
        self.cp: CPContext | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank sees only its own heads.
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        cp = self.cp
        if self.rope:
            if cp is None:
                cos, sin = _rope_tables(s, self.head_dim, q.device, q.dtype)
            else:  # the rows of this rank's tokens' global positions
                cos, sin = _cp_rope_tables(cp, self.head_dim, q.device, q.dtype)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        kwargs = {"flash": self.flash, "dropout": self.dropout, "training": self.training}
        if cp is not None:
            # All-gather K and V (after RoPE) over the cp group; the local queries attend to the
            # whole sequence under the causal mask by global positions. Under full recompute
            # the gather runs again in the recompute; under selective recompute the gathered
            # K/V are the recomputed core's inputs and stay saved.
            k, v = cp.gather(k), cp.gather(v)
            if self.flash:
                kwargs["allowed"] = cp.additive(q.device, q.dtype)
            else:
                kwargs["blocked"] = cp.blocked(q.device)
        if self.selective:
            # Korthikanti et al. 2022 §4.2: recompute only the attention core.
            out = checkpoint(attention_core, q, k, v, use_reentrant=False, **kwargs)
        else:
            out = attention_core(q, k, v, **kwargs)
        out = out.transpose(1, 2).reshape(b, s, -1)
        return F.dropout(self.wo(out), p=self.dropout, training=self.training)


class MLP(nn.Module):
    """A dense block's MLP (width ``ffn_hidden``), or one expert of an MoE block (``width``
    ``expert_ffn_hidden``, its dropout left to the MoE block's combined output)."""

    def __init__(self, spec: ModelSpec, width: int | None = None) -> None:
        super().__init__()
        h, f = spec.hidden, spec.ffn_hidden if width is None else width
        self.swiglu = spec.activation == "swiglu"
        self.dropout = spec.dropout if width is None else 0.0
        self.w1 = nn.Linear(h, f, bias=spec.bias)
        self.w2 = nn.Linear(f, h, bias=spec.bias)
        self.w3 = nn.Linear(h, f, bias=spec.bias) if self.swiglu else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            y = F.silu(self.w1(x)) * self.w3(x)
        else:
            y = F.gelu(self.w1(x), approximate="tanh")
        return F.dropout(self.w2(y), p=self.dropout, training=self.training)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, flash: bool, recompute: str, layer: int = 0,
                 experts: range | None = None) -> None:
        super().__init__()
        self.attention_norm = _norm(spec)
        self.attention = Attention(spec, flash,
                                   selective_recompute=recompute == Recompute.SELECTIVE)
        self.ffn_norm = _norm(spec)
        self.feed_forward = (MoE(spec, MLP, experts) if spec.moe_block(layer)
                             else MLP(spec))
        self.full_recompute = recompute == "full"
        self.op_recompute = recompute == Recompute.SELECTIVE_OP

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.full_recompute and torch.is_grad_enabled():
            # Full recompute keeps only the block input (Korthikanti et al. 2022: 2·s·b·h).
            return checkpoint(block_runs(self._forward, self.feed_forward), x,
                              use_reentrant=True)
        if self.op_recompute and torch.is_grad_enabled():
            # Op-level selective (torchtitan's policy): keeps the block input, every second
            # matmul's and the attention kernel's outputs.
            return checkpoint_selective_op(block_runs(self._forward, self.feed_forward), x)
        return self._forward(x)


class PositionEmbedding(nn.Module):
    """Learned positions, added to the token embeddings (GPT)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(spec.seq_len, spec.hidden))
        self.dropout = spec.dropout
        self.cp: CPContext | None = None  # context parallelism: the rows of global positions

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = self.weight[: x.shape[1]] if self.cp is None else self.cp.local_rows(self.weight)
        return F.dropout(x + pos, p=self.dropout, training=self.training)


class GPT(nn.Module):
    """The whole model, or one pipeline stage of it (``layer_ids``, ``first``, ``last``).

    Input: token ids (b, s) on the first stage, hidden states otherwise. Output: logits (b, s, V)
    on the last stage, hidden states otherwise.
    """

    def __init__(self, spec: ModelSpec, *, layer_ids: Iterable[int] | None = None,
                 first: bool = True, last: bool = True, flash: bool = True,
                 recompute: str = "none", experts: range | None = None) -> None:
        super().__init__()
        self.spec = spec
        ids = list(range(spec.layers)) if layer_ids is None else list(layer_ids)
        self.first, self.last = first, last
        self.tok_embeddings = nn.Embedding(spec.vocab, spec.hidden) if first else None
        self.pos_embeddings = (PositionEmbedding(spec)
                               if first and spec.position == "learned" else None)
        # Keyed by global layer index so names (and the init) are the same in every layout.
        self.layers = nn.ModuleDict({
            str(i): Block(spec, flash, recompute, i, experts) for i in ids})
        self.norm = _norm(spec) if last else None
        self.output = nn.Linear(spec.hidden, spec.vocab, bias=False) if last else None
        self.emb_dropout = spec.dropout if spec.position != "learned" else 0.0
        if first and last and spec.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None:
            x = self.tok_embeddings(x)
            if self.pos_embeddings is not None:
                x = self.pos_embeddings(x)
            elif self.emb_dropout:
                x = F.dropout(x, p=self.emb_dropout, training=self.training)
        for layer in self.layers.values():
            x = layer(x)
        if self.norm is not None:
            x = self.norm(x)
        if self.output is not None:
            x = self.output(x)
        return x


def apply_cp(model: nn.Module, cpc: CPContext) -> None:
    """Make ``model``'s attention layers and learned positions context parallel (here, beside
    them: bench/context_parallel.py holds the exchange and never imports the model)."""
    for m in model.modules():
        if isinstance(m, Attention | PositionEmbedding):
            m.cp = cpc
        elif isinstance(m, MoE):  # its aux loss counts the whole sequences' assignments
            m.cp_group = cpc.group


def _param_seed(seed: int, name: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


def init_weights(model: GPT, seed: int) -> None:
    """Initialise every parameter from a generator keyed by (seed, parameter name).

    The values then do not depend on which parameters a stage holds or in which order they were
    created, which is what lets a pipeline stage match the single-process reference exactly.
    GPT-2 / Megatron scheme: N(0, 0.02), output projections N(0, 0.02/√(2L)), zero biases,
    unit norm weights.
    """
    spec = model.spec
    out_std = INIT_STD / math.sqrt(2.0 * spec.layers)
    tied = spec.tied_embeddings
    with torch.no_grad():
        for name, p in model.named_parameters(remove_duplicate=True):
            leaf = name.rsplit(".", 1)[-1]
            key = "tok_embeddings.weight" if tied and name == "output.weight" else name
            if "norm" in name:
                values = (torch.ones if leaf == "weight" else torch.zeros)(p.shape)
            elif leaf == "bias":
                values = torch.zeros(p.shape)
            else:
                gen = torch.Generator().manual_seed(_param_seed(seed, key))
                std = out_std if name.endswith(("wo.weight", "w2.weight")) else INIT_STD
                values = torch.randn(p.shape, generator=gen) * std
            p.copy_(values.to(p.dtype))


def build_model(spec: ModelSpec, *, seed: int, dtype: str = "fp32",
                device: torch.device | str = "cpu", layer_ids: Iterable[int] | None = None,
                first: bool = True, last: bool = True, flash: bool = True,
                recompute: str = "none", experts: range | None = None) -> GPT:
    """A model (or stage) with deterministic weights, in ``dtype`` on ``device``; ``experts``:
    the routed experts its MoE blocks hold (default all; an ep rank's share, bench/moe.py
    ``ep_experts``), each with the weights it has in the whole model."""
    # Built in its dtype on its device rather than converted with ``Module.to``: the values are
    # the same (init_weights rounds each fp32 draw once), and fake tensors (flm memcheck) cannot
    # be swapped by ``Module.to``.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(DTYPES[dtype])
    try:
        with torch.device(device):
            model = GPT(spec, layer_ids=layer_ids, first=first, last=last, flash=flash,
                        recompute=recompute, experts=experts)
    finally:
        torch.set_default_dtype(previous)
    init_weights(model, seed)
    return model


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy over the micro-batch (computed in fp32)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))
