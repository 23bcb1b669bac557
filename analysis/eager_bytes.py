"""Measure the element-wise traffic of one eager (un-compiled) PyTorch Llama block: the source of
``EAGER_BYTES_PER_TOKEN`` in frontier_llm/costmodel/steptime.py.

A TorchDispatchMode sums the input and output tensor bytes of every aten op of one bf16 block's
forward and backward on CPU, leaving out the matmuls and the attention kernel (costed as FLOPs)
and the ops that move nothing (views, transposes, empty allocations). The block is written as
torchtitan's and Meta's reference ``llama/model.py`` write it (RMSNorm through fp32:
``self._norm(x.float()).type_as(x) * self.weight``; RoPE through ``view_as_complex``;
``repeat_kv``; SwiGLU ``w2(silu(w1 x) * w3 x)``; SDPA ``is_causal``). Each aten op is one
kernel in eager mode, so its bytes cross HBM once.

    python analysis/eager_bytes.py    # per-token bytes per shape, and the a·h + b·kv + c·f fit
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten
MATMUL = {aten.mm, aten.addmm, aten.bmm, aten.matmul, aten.linear, aten.baddbmm}
ATTENTION = ("_scaled_dot_product", "scaled_dot_product", "_flash_attention",
             "_efficient_attention")
NO_TRAFFIC = {"view", "_unsafe_view", "t", "transpose", "expand", "as_strided", "detach",
              "alias", "view_as_complex", "view_as_real", "unsqueeze", "squeeze", "permute",
              "slice", "select", "_reshape_alias", "split", "split_with_sizes", "unbind",
              "lift_fresh", "empty", "empty_like", "zeros", "zeros_like", "ones_like",
              "new_empty_strided", "new_zeros", "empty_strided"}
# (name, hidden, ffn, heads, kv_heads): Llama 2 7B/13B/34B (fms llama2_34b)/70B, Llama 3 8B.
SHAPES = [("7B", 4096, 11008, 32, 32), ("13B", 5120, 13824, 40, 40),
          ("34B", 8192, 22016, 64, 8), ("70B", 8192, 28672, 64, 8),
          ("L3-8B", 4096, 14336, 32, 8)]


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


class ByteCount(TorchDispatchMode):
    """Bytes read + written per aten op (element-wise and reductions only)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if func.overloadpacket in MATMUL or name.startswith(ATTENTION) or name in NO_TRAFFIC:
            return out
        moved = sum(map(_nbytes, tree_flatten((args, kwargs))[0]))
        moved += sum(map(_nbytes, tree_flatten(out)[0]))
        self.ops[name] = self.ops.get(name, 0) + moved
        return out


class RMSNorm(torch.nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight


def _rope(xq, xk, freqs):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    f = freqs.view(1, xq_.shape[1], 1, xq_.shape[-1])
    return (torch.view_as_real(xq_ * f).flatten(3).type_as(xq),
            torch.view_as_real(xk_ * f).flatten(3).type_as(xk))


class Block(torch.nn.Module):
    def __init__(self, h: int, f: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv, self.hd = heads, kv_heads, h // heads

        def lin(i, o):
            return torch.nn.Linear(i, o, bias=False)

        self.wq, self.wo = lin(h, h), lin(h, h)
        self.wk, self.wv = lin(h, kv_heads * self.hd), lin(h, kv_heads * self.hd)
        self.w1, self.w2, self.w3 = lin(h, f), lin(f, h), lin(h, f)
        self.n1, self.n2 = RMSNorm(h), RMSNorm(h)

    def _attention(self, x, freqs):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.heads, self.hd)
        k = self.wk(x).view(b, s, self.kv, self.hd)
        v = self.wv(x).view(b, s, self.kv, self.hd)
        q, k = _rope(q, k, freqs)
        rep = self.heads // self.kv
        if rep > 1:  # torchtitan's repeat_kv
            shape = (b, s, self.kv, rep, self.hd)
            k = k[:, :, :, None, :].expand(shape).reshape(b, s, self.heads, self.hd)
            v = v[:, :, :, None, :].expand(shape).reshape(b, s, self.heads, self.hd)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        return self.wo(o.transpose(1, 2).contiguous().view(b, s, -1))

    def forward(self, x, freqs):
        h = x + self._attention(self.n1(x), freqs)
        y = self.n2(h)
        return h + self.w2(F.silu(self.w1(y)) * self.w3(y))


def measure(h: int, f: int, heads: int, kv: int, seq: int = 64) -> tuple[float, dict]:
    """Bytes per token of one block's forward + backward, and per op."""
    torch.manual_seed(0)
    block = Block(h, f, heads, kv).to(torch.bfloat16)
    hd = h // heads
    angles = torch.outer(torch.arange(seq).float(),
                         1.0 / 10000 ** (torch.arange(0, hd, 2).float() / hd))
    freqs = torch.polar(torch.ones_like(angles), angles)
    x = torch.randn(1, seq, h, dtype=torch.bfloat16, requires_grad=True)
    count = ByteCount()
    with count:
        y = block(x, freqs)
        y.backward(torch.ones_like(y))
    return sum(count.ops.values()) / seq, count.ops


def main() -> None:
    rows = []
    for name, h, f, heads, kv in SHAPES:
        per_token, _ = measure(h, f, heads, kv)
        kv_width = kv * (h // heads)
        fused = 3 * (20 * h + 6 * f)
        rows.append((h, kv_width, f, per_token))
        print(f"{name:6s} eager {per_token:10.0f} B/token/layer, fused count {fused:8d}, "
              f"x{per_token / fused:.2f}")
    a = np.array([r[:3] for r in rows], float)
    y = np.array([r[3] for r in rows])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    print("fit a·h + b·kv + c·f:", np.round(coef, 1),
          "max residual %.2f %%" % (100 * np.max(np.abs(a @ coef - y) / y)))


if __name__ == "__main__":
    main()
