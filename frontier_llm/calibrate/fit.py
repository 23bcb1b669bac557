"""Fit the cost model's link and matrix parameters to microbenchmark timings (pure functions).

Links (Hockney's alpha-beta model, with the ring algorithms of Thakur, Rabenseifner and Gropp
2005 that :mod:`frontier_llm.costmodel.comm` uses): an operation over ``n`` ranks on ``nbytes``
takes ``t = c_lat·α + c_bw·nbytes/β`` with

    all-reduce             c_lat = 2(n−1)   c_bw = 2(n−1)/n
    all-gather, r-scatter  c_lat = n−1      c_bw = (n−1)/n
    send-receive           c_lat = 1        c_bw = 1

so every operation and group size of a tier constrains the same two numbers, the tier's start-up
time ``α`` (seconds) and bandwidth ``β`` (bytes/s per rank and direction). The fit minimises the
*relative* error (timings span six decades; an absolute fit would see only the largest
messages): least squares of ``(c_lat·α + c_bw·x·γ)/t − 1`` with ``γ = 1/β``, both non-negative.

Matrices: a GEMM whose weight's smaller side is ``d`` runs at the cost model's
``R·d/(d + h½)`` (:mod:`frontier_llm.costmodel.gemm`), so a block's GEMMs together (FLOPs
``F_i``) take ``ΣF_i·(1 + h½/d_i)/R``: ``1/rate = 1/R + (h½/R)·x`` with ``x = ΣF_i/d_i / ΣF_i``,
linear in ``x``, fitted the same relative way. ``R`` over the datasheet peak is the system's
``matmul`` efficiency; ``h½`` its ``matmul_half_hidden``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from frontier_llm.costmodel.gemm import size_factor
from frontier_llm.errors import UserError

MIN_SIZES_PER_TIER = 3  # two unknowns, and one more point to see a residual
COLLECTIVE_COLUMNS = ("library", "op", "tier", "group_size", "nbytes", "time_s")
MATMUL_COLUMNS = ("tp", "hidden", "n", "k", "flops", "time_s")


def ring_coefficients(op: str, n) -> tuple[np.ndarray, np.ndarray]:
    """(c_lat, c_bw) of ``op`` over ``n`` ranks (arrays)."""
    n = np.asarray(n, dtype=float)
    if op == "all_reduce":
        return 2 * (n - 1), 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return n - 1, (n - 1) / n
    if op == "send_recv":
        return np.ones_like(n), np.ones_like(n)
    raise UserError(f"unknown collective {op!r} in the timings "
                    "(all_reduce, all_gather, reduce_scatter, send_recv)")


@dataclass(frozen=True)
class TierFit:
    library: str
    tier: str
    latency_s: float  # alpha
    bandwidth: float  # beta, bytes/s
    points: int
    sizes: int
    group_sizes: tuple[int, ...]
    rms_rel_residual: float
    max_rel_residual: float
    per_op_rms: dict[str, float] = field(default_factory=dict)

    def predict(self, op: str, n, nbytes) -> np.ndarray:
        c_lat, c_bw = ring_coefficients(op, n)
        return c_lat * self.latency_s + c_bw * np.asarray(nbytes, float) / self.bandwidth


@dataclass(frozen=True)
class MatmulFit:
    dtype: str
    rate: float  # R, FLOP/s at large width
    half_hidden: float  # h½
    points: int
    widths: tuple[int, ...]
    rms_rel_residual: float
    max_rel_residual: float
    per_tp_rms: dict[int, float] = field(default_factory=dict)
    # False when the achieved rate still rose at the widest width measured: ``rate`` is then
    # the highest rate measured, a lower bound of the asymptote, not a fitted one.
    saturated: bool = True

    def predict(self, side) -> np.ndarray:
        """The rate of a GEMM whose weight's smaller side is ``side``."""
        return self.rate * size_factor(side, self.half_hidden)


def check_timings(df: pd.DataFrame, columns: tuple[str, ...], what: str) -> None:
    """Refuse a table without the columns or with non-positive or missing timings."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise UserError(f"{what} timings lack column(s) {', '.join(missing)}")
    t = pd.to_numeric(df["time_s"], errors="coerce")
    bad = df[~(t > 0)]
    if len(bad):
        first = bad.iloc[0]
        where = (f"{first['op']} of {first['nbytes']} bytes" if "op" in df.columns
                 else f"GEMM {first.get('name', '')} at hidden {first['hidden']}")
        raise UserError(f"{what} timings hold {len(bad)} non-positive or missing time_s "
                        f"value(s) (first: {where}); re-run the microbenchmark")


def _relative_nnls(A: np.ndarray, t: np.ndarray) -> np.ndarray:
    x, _ = nnls(A / t[:, None], np.ones_like(t))
    return x


def fit_tier(df: pd.DataFrame, library: str, tier: str) -> TierFit:
    """α and β of one tier from its rows (every op and group size of that library and tier)."""
    rows = df[(df["library"] == library) & (df["tier"] == tier)]
    sizes = sorted(rows["nbytes"].unique())
    groups = sorted(int(g) for g in rows["group_size"].unique())
    if len(sizes) < MIN_SIZES_PER_TIER:
        raise UserError(f"tier {tier} ({library}): {len(sizes)} message size(s) measured, "
                        f"need at least {MIN_SIZES_PER_TIER} to fit latency and bandwidth")
    if not groups or max(groups) < 2:
        raise UserError(f"tier {tier} ({library}): no group of 2 or more ranks measured; "
                        "a calibration needs at least 2 ranks in the tier")
    rows = rows[rows["group_size"] >= 2]
    c_lat = np.empty(len(rows))
    c_bw = np.empty(len(rows))
    for i, (op, n) in enumerate(zip(rows["op"], rows["group_size"], strict=True)):
        a, b = ring_coefficients(op, n)
        c_lat[i], c_bw[i] = float(a), float(b)
    x_bytes = rows["nbytes"].to_numpy(float)
    t = rows["time_s"].to_numpy(float)
    alpha, gamma = _relative_nnls(np.column_stack([c_lat, c_bw * x_bytes]), t)
    if gamma <= 0:
        raise UserError(f"tier {tier} ({library}): the timings do not grow with the message "
                        "size, so no bandwidth can be fitted (raise --max-bytes)")
    pred = c_lat * alpha + c_bw * x_bytes * gamma
    rel = pred / t - 1
    per_op = {op: float(np.sqrt(np.mean(rel[(rows["op"] == op).to_numpy()] ** 2)))
              for op in sorted(rows["op"].unique())}
    return TierFit(library=library, tier=tier, latency_s=float(alpha), bandwidth=float(1 / gamma),
                   points=len(rows), sizes=len(sizes), group_sizes=tuple(groups),
                   rms_rel_residual=float(np.sqrt(np.mean(rel**2))),
                   max_rel_residual=float(np.max(np.abs(rel))), per_op_rms=per_op)


def fit_links(df: pd.DataFrame) -> dict[tuple[str, str], TierFit]:
    """One :class:`TierFit` per (library, tier) in the collective timings."""
    if df.empty:
        raise UserError("no collective timings: a calibration needs at least 2 ranks "
                        "(flm calibrate run --nproc 2 or more)")
    check_timings(df, COLLECTIVE_COLUMNS, "collective")
    return {(lib, tier): fit_tier(df, lib, tier)
            for lib, tier in sorted(set(zip(df["library"], df["tier"], strict=True)))}


def block_rates(df: pd.DataFrame) -> pd.DataFrame:
    """The achieved rate of each block (its GEMMs together, as the cost model counts a block's
    dense FLOPs at one rate), per (tp, hidden), with ``inverse_side``, the FLOP-weighted mean
    of ``1/d`` over its GEMMs (``d`` the weight's smaller side, ``min(n, k)``)."""
    per_side = df["flops"] / np.minimum(df["n"], df["k"]).astype(float)
    g = (df.assign(per_side=per_side)
         .groupby(["tp", "hidden"], as_index=False)[["flops", "time_s", "per_side"]].sum())
    g["flops_per_s"] = g["flops"] / g["time_s"]
    g["inverse_side"] = g["per_side"] / g["flops"]
    return g.drop(columns="per_side")


def fit_matmul(df: pd.DataFrame, dtype: str) -> MatmulFit:
    """``R`` and ``h½`` from the GEMM timings (every tp and width)."""
    if df.empty:
        raise UserError("no GEMM timings to fit the matrix rate")
    check_timings(df, MATMUL_COLUMNS, "matmul")
    blocks = block_rates(df)
    widths = tuple(sorted(int(h) for h in blocks["hidden"].unique()))
    inv_rate = 1.0 / blocks["flops_per_s"].to_numpy(float)
    x_side = blocks["inverse_side"].to_numpy(float)
    # Two block sizes tell the size effect from the rate: two widths, or one width at two TP
    # degrees (TP narrows the GEMMs).
    sized = len(np.unique(np.round(x_side, 12))) >= 2
    if sized:
        a, b = _relative_nnls(np.column_stack([np.ones_like(x_side), x_side]), inv_rate)
    else:  # one block size: no size effect can be told apart from the rate
        a, b = _relative_nnls(np.ones((len(x_side), 1)), inv_rate)[0], 0.0
    saturated = a > 0
    if not saturated:
        # The rate rose across every width measured (noise on a loaded CPU does it at small
        # widths): the asymptote is not in the data. The highest rate measured bounds it from
        # below; h½ is then fitted to the rest with that rate held.
        a = float(np.min(inv_rate))
        x, y = x_side / inv_rate, 1.0 - a / inv_rate  # relative residuals, as _relative_nnls
        b = max(0.0, float(x @ y / (x @ x))) if sized else 0.0
    rate, half = 1.0 / a, b / a
    pred_inv = a + b * x_side
    rel = inv_rate / pred_inv - 1  # achieved rate over predicted rate, minus one
    per_tp = {int(tp): float(np.sqrt(np.mean(rel[(blocks["tp"] == tp).to_numpy()] ** 2)))
              for tp in sorted(blocks["tp"].unique())}
    return MatmulFit(dtype=dtype, rate=float(rate), half_hidden=float(half), points=len(blocks),
                     widths=widths, rms_rel_residual=float(np.sqrt(np.mean(rel**2))),
                     max_rel_residual=float(np.max(np.abs(rel))), per_tp_rms=per_tp,
                     saturated=saturated)


def links_table(fits: dict[tuple[str, str], TierFit]) -> pd.DataFrame:
    """The link fits as a table for printing."""
    return pd.DataFrame([{
        "library": f.library, "tier": f.tier, "latency_us": f.latency_s * 1e6,
        "bandwidth_GBps": f.bandwidth / 1e9, "points": f.points, "sizes": f.sizes,
        "groups": ",".join(map(str, f.group_sizes)),
        "rms_resid_pct": 100 * f.rms_rel_residual, "max_resid_pct": 100 * f.max_rel_residual,
    } for f in fits.values()])
