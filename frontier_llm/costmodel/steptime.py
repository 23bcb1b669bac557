"""Step time of one training iteration, with its breakdown.

Per micro-batch and transformer block, a rank spends:

- matrix work: the block's FLOPs (Narayanan et al. 2021; :mod:`.flops`) over ``t`` ranks at the
  system's achievable ``matmul`` fraction of peak, less the share its GEMMs lose to their size
  on the rank (:mod:`.gemm`: the weights' smaller sides after the TP split), backward twice the
  forward;
- memory-bound element-wise work (norms, bias + dropout + residual, GeLU, softmax when attention
  is not fused): the bytes it reads and writes at the ``memory`` fraction of HBM bandwidth;
- tensor-parallel communication (Shoeybi et al. 2019; Korthikanti et al. 2022 §4.2.2): two
  all-reduces of ``b·s·h`` elements forward and two backward (with sequence parallelism an
  all-gather and a reduce-scatter each, the same volume); where the engine overlaps TP
  communication (Megatron's ``--tp-comm-overlap``), up to the ``tp_overlap`` fraction of the
  block's GEMM time hides it;
- recomputation: full recompute replays the forward (and its TP communication); selective replays
  the attention core only; op-level selective replays all but the matmuls and attention kernel
  it keeps (:mod:`.checkpoint_policy`).

A pipeline rank holds the blocks its engine's split gives it (:mod:`.split`); the first adds the
embedding, the last the output head and the loss. Pipeline stages exchange ``b·s·h/t`` elements
per micro-batch each way (Megatron's scatter/gather optimization), once per virtual stage. With
``m`` micro-batches the pipeline takes ``m·t_max + (p−1)/v·t_avg`` (the bubble of Narayanan et
al. 2021 §2.2), the slowest rank setting ``t_max``. Data parallelism reduces gradients once per
step (all-reduce, or reduce-scatter + all-gather of parameters when optimizer states are
sharded), behind the last micro-batch's backward where the engine buckets it; DeepSpeed's
ZeRO-2 after every micro-batch, by all-reduce, its ZeRO-0 after backward and its parameter
gather inside the step, exposed (``specs/engine_rules.py``). Sharded parameters
(ZeRO-3, FSDP, AMSP partial) are gathered layer by layer, forward and (resharded) backward, and
gradients reduce-scattered, every micro-batch, as the engine issues them
(:func:`sharded_param_times`). Every engine behaviour comes from ``specs/engine_rules.py``
(:mod:`.behaviour`). The optimizer step streams the rank's parameters, gradients and optimizer
states through memory.

Context parallelism (``cp``): a rank computes ``seq_len/cp`` tokens of each sequence (GEMMs,
attention, element-wise work and TP traffic all ``/cp``; the load-balanced split makes the
causal attention work equal on every cp rank), exchanges K and V per layer
(:func:`cp_exchange_times`, the ``cp_comm`` part; under the native engine either flm bench's
single gather or, with ``cp_exchange`` "ring", PyTorch's ``context_parallel`` ring, which also
merges its partial attentions in fp32: :func:`cp_merge_bytes`, in the same part), and reduces
gradients over the dp x cp ranks.
docs/costmodel.md "Context parallelism".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from frontier_llm.costmodel import attention_kernels, comm, fp8, gemm, moe
from frontier_llm.costmodel.behaviour import behaviour, cp_ring, reduces_fp32
from frontier_llm.costmodel.checkpoint_policy import kept_dense_fraction
from frontier_llm.costmodel.flops import (
    layer_forward_flops_per_token,
    logits_forward_flops_per_token,
)
from frontier_llm.costmodel.gemm import sdpa_kv_width_per_rank
from frontier_llm.costmodel.layouts import LayoutTable, dtype_peaks
from frontier_llm.costmodel.memory import (
    ACT_BYTES,
    STATE_BYTES,
    bf16_optimizer_states,
    grad_sync_each,
)
from frontier_llm.costmodel.p2p_overlap import acts_on as p2p_acts_on
from frontier_llm.costmodel.params import (
    layer_modules,
    stage_params_per_rank,
    table_layer_params,
)
from frontier_llm.costmodel.split import pipeline_ranks
from frontier_llm.specs import axes
from frontier_llm.specs.layout import DType, Engine, PlacementKind, Recompute
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec

# Bytes an Adam step moves per parameter: read parameter, gradient, master weight and two
# moments, write all but the gradient (fp32 training has no separate master copy).
OPTIMIZER_TRAFFIC = np.array([{DType.FP32: 4 + 4 + 8 + 4 + 8, DType.BF16: 2 + 4 + 12 + 2 + 12,
                               DType.FP16: 2 + 4 + 12 + 2 + 12,
                               DType.FP8: 2 + 4 + 12 + 2 + 12}[d] for d in DType])

# Bytes per parameter BF16_Optimizer moves after each micro-batch (:func:`data_parallel_times`)
# into an fp32 accumulator: read the bf16 ``.grad`` (2), write and read its fp32 copy
# (``lp.grad.to(hp_grad.dtype)``: 4 + 4), read and write the accumulator (4 + 4), zero the
# ``.grad`` before the next backward (2).
HP_GRAD_ACCUMULATE_BYTES = 2 + 4 + 4 + 4 + 4 + 2
# Into a bf16 one (``grad_acc_dtype`` bf16, DeepSpeed's default: ``.to`` of a tensor already in
# that dtype returns it, no copy): read the ``.grad`` (2), read and write the accumulator (2 + 2),
# zero the ``.grad`` (2).
LP_GRAD_ACCUMULATE_BYTES = 2 + 2 + 2 + 2
# Bytes per element of its partition BF16_Optimizer's step adds to Adam's (OPTIMIZER_TRAFFIC,
# which reads an fp32 gradient) when it accumulates in bf16: ``grad_partition.to(fp32)`` reads
# the bf16 partition and writes an fp32 copy (runtime/bf16_optimizer.py ``step``).
LP_GRAD_CAST_BYTES = 2 + 4


@dataclass
class _Rates:
    """What the system delivers to one rank of these layouts."""

    flops: np.ndarray  # achievable matmul FLOP/s (16/32-bit: attention, head)
    memory: float  # achievable HBM bytes/s
    act_bytes: np.ndarray  # bytes per activation element
    linear: np.ndarray | None = None  # a block's linear GEMMs' FLOP/s (fp8: costmodel/fp8.py)


@dataclass
class BlockTimes:
    """One transformer block, one micro-batch (seconds; forward parts unless named)."""

    dense: np.ndarray  # GEMMs of the block
    attn: np.ndarray  # attention core (Q·Kᵀ, ·V)
    elem: np.ndarray  # memory-bound element-wise passes
    softmax: np.ndarray  # unfused softmax over the scores
    fixed: float  # per-layer launch overhead
    fwd: np.ndarray  # the whole forward
    recompute: np.ndarray  # compute replayed in backward
    compute: np.ndarray  # forward + backward (2x) + recompute
    comm: np.ndarray  # exposed tensor-parallel communication
    cp_comm: np.ndarray  # exposed context-parallel K/V exchange (cp_exchange_times) and
    # the native ring's fp32 merge traffic (cp_merge_bytes)
    ep_comm: np.ndarray | float = 0.0  # exposed expert-parallel all-to-alls (costmodel/moe.py)
    attn_bwd_extra: np.ndarray | float = 0.0  # a measured kernel's backward beyond 2x its
    # forward (costmodel/attention_kernels.py), in ``compute``


@dataclass
class StageTimes:
    """The pipeline: per micro-batch stage times, the whole pipeline and its bubble."""

    layers: np.ndarray  # blocks on the rank that sets the pace
    head: np.ndarray  # the output head, loss and CE statistics per micro-batch, when the last
    # rank sets the pace (else 0)
    p2p: np.ndarray  # activations sent and received per micro-batch
    compute_mb: np.ndarray  # compute of one micro-batch on a stage (for DP overlap)
    pipeline: np.ndarray
    bubble: np.ndarray


# Element-wise traffic of one eager (un-compiled) PyTorch Llama block, forward + backward, in
# bytes per token with 16-bit activations: ``a·h + b·kv + c·f`` (h hidden, kv the K/V width, f
# the MLP width). Measured on CPU by analysis/eager_bytes.py, which sums the input and output
# bytes of every non-matmul, non-attention aten op of a bf16 block written as torchtitan's and
# Meta's reference llama/model.py write it: RMSNorm as ``x.float()``, ``pow(2).mean``,
# ``rsqrt``, ``mul``, ``type_as``, ``* weight`` (each a kernel, through fp32); RoPE through
# ``view_as_complex`` in fp32; ``repeat_kv`` copies; SwiGLU as ``silu(w1 x) * w3 x``; the
# residual adds; and autograd's backward of each. Fit over the Llama 2 7B/13B/34B/70B and Llama
# 3 8B shapes, residuals under 0.5 %; 4x what the fused count below charges (3 x
# (20·h + 6·f)). A compiled or TransformerEngine/XLA run fuses these chains (the fused count).
EAGER_BYTES_PER_TOKEN = (359.0, 27.0, 29.0)


def _rates(model: ModelSpec, system: SystemSpec, t: LayoutTable) -> _Rates:
    flops = (dtype_peaks(system)[fp8.compute_dtype(t)] * system.eff("matmul")
             * gemm.block_factor(model, t.tp, system.matmul_half_hidden))
    return _Rates(flops, system.memory_bandwidth * system.eff("memory"), ACT_BYTES[t.dtype],
                  flops * fp8.linear_speedup(system, t))


def block_times(model: ModelSpec, system: SystemSpec, t: LayoutTable, r: _Rates,
                eager: bool = False, tp_comm_overlap: bool = False,
                moe_run: moe.MoeRun = moe.NO_OVERLAP, cp_exchange: str | None = None,
                cp_heads: int | None = None) -> BlockTimes:
    """One block's compute, element-wise, recompute and TP communication time. ``eager``: the
    run executes PyTorch's ops one kernel each (no torch.compile), so its element-wise work is
    :data:`EAGER_BYTES_PER_TOKEN`, not the fused count. ``tp_comm_overlap``: the run turns on
    the TP overlap its engine can do (Megatron-LM's ``--tp-comm-overlap``); off, as flm's
    Megatron-LM command renders it and NVIDIA's bf16 GPT-3 175B recipe runs it
    (NeMo-Framework-Launcher conf/training/gpt3/175b.yaml: ``ub_tp_comm_overlap: False``),
    every TP collective is exposed. ``moe_run``: how an MoE run dispatches and overlaps its
    all-to-alls (costmodel/moe.py MoeRun; default Megatron-LM's, none overlapped).
    ``cp_exchange``: the native engine's context-parallel exchange (None: the engine's rule;
    :func:`~frontier_llm.costmodel.behaviour.cp_ring`). ``cp_heads``: the K/V heads the
    native ring exchanges and merges (:func:`kv_exchange_bytes`; None: the model's kv heads)."""
    s, h, f = model.seq_len, model.hidden, model.ffn_hidden
    tp, e = t.tp, r.act_bytes
    # The rank's tokens: seq_len/cp of each sequence (context parallelism). Attention work per
    # token is counted against the whole sequence (flops.layer_forward_flops_per_token), so a
    # rank's attention is the sequence's total / cp: the load-balanced split (chunks r and
    # 2cp-1-r) gives every cp rank the same causal work (docs/costmodel.md).
    tokens = t.micro_batch * t.local_seq(s)
    rep = np.where(t.sequence_parallel, 1.0 / tp, 1.0)
    heads = model.heads / tp
    dense, attn = layer_forward_flops_per_token(model)
    f_dense = dense * tokens / tp / r.linear
    if model.is_moe:  # the slowest EP rank's expert GEMMs (costmodel/moe.py)
        routed = moe.routed_flops_per_token(model) * tokens / tp / r.linear
        f_dense = f_dense + moe.routed_gemm_extra(model, t, routed, system.matmul_half_hidden)
    f_attn = attn * tokens / tp / r.flops
    # Where the engine's fused kernel has a published rate on this chip, the attention core
    # runs at it: the kernel's forward, and its backward in place of twice that.
    kernel, k_fwd, k_bwd = attention_kernels.kernel_times(
        model, system, t, attn * tokens / tp, t.local_seq(s))
    f_attn = np.where(kernel, k_fwd, f_attn)
    attn_bwd_extra = np.where(kernel, k_bwd - 2 * k_fwd, 0.0)
    drop = model.dropout > 0
    # Element-wise passes over b·s·h: 2 norms (read + write) and 2 bias-dropout-residual adds
    # (read 2, write 1, plus the mask); over b·s·f/t: the fused bias + activation (read, write).
    whole_bytes = tokens * h * e * rep * (4 + 2 * (3 + (0.5 if drop else 0)))
    act_passes = 2 if model.activation == "gelu" else 3
    split_bytes = tokens * (f / tp) * e * act_passes
    # Without a fused attention kernel, scale + mask + softmax (+ dropout) stream the scores.
    score_bytes = heads * s * tokens * e * (2 + (2.5 if drop else 0))
    f_elem = (whole_bytes + split_bytes) / r.memory
    if eager:
        # Measured eager traffic (forward + backward; the block's compute is 3x the forward, so
        # a third of it is charged here): norms and residuals over b·s·h (b·s·h/t with sequence
        # parallelism), the K/V and MLP parts split over TP; scaled from 16-bit by the dtype.
        # Engines whose models always fuse (Megatron-LM) keep the fused count.
        a, b, c = EAGER_BYTES_PER_TOKEN
        eager_bytes = tokens * (a * h * rep + (b * model.kv_dim + c * f) / tp) * e / 2
        f_elem = np.where(behaviour(t, "fused_elementwise"), f_elem, eager_bytes / 3 / r.memory)
    # FP8's casts of each linear's operands (forward and backward; a third charged here, as
    # the block's compute is three forwards).
    f_elem = f_elem + fp8.cast_bytes_per_microbatch(model, t, tokens) / 3 / r.memory
    f_softmax = np.where(t.flash_attention, 0.0, score_bytes / r.memory)
    f_fixed = system.layer_overhead_s
    fwd = f_dense + f_attn + f_elem + f_softmax + f_fixed

    tp_ar = comm.all_reduce(system, tp, 1, tokens * h * e)
    # The attention's collective and the MLP's; an MoE block's MLP runs its over etp ranks.
    mlp_ar = moe.mlp_tp_comm(model, system, t, tp_ar, tokens * h * e) if model.is_moe else tp_ar
    fwd_comm = tp_ar + mlp_ar
    bwd_comm = tp_ar + mlp_ar
    full = t.recompute == Recompute.FULL.code
    selective = t.recompute == Recompute.SELECTIVE.code
    # Op-level selective replays the block but the matmuls and attention kernel it kept
    # (costmodel/checkpoint_policy.py); TP collectives' outputs are kept too (torchtitan's policy
    # saves them), so no TP communication is replayed.
    op = t.recompute == Recompute.SELECTIVE_OP.code
    op_replay = fwd - f_dense * kept_dense_fraction(model, tp) - np.where(
        t.flash_attention, f_attn, 0.0)
    recompute = np.select([full, selective, op], [fwd, f_attn + f_softmax, op_replay], 0.0)
    recompute_comm = np.where(full, fwd_comm, 0.0)
    # Overlapped TP communication (Megatron's tp-comm-overlap) hides behind the GEMMs it is
    # pipelined with, never more than they last; only beside sequence parallelism, the one way
    # Megatron-LM runs it (costmodel/tp_overlap.py: validate_args asserts it).
    overlap = np.where(behaviour(t, "tp_comm_overlap") & tp_comm_overlap
                       & t.sequence_parallel.astype(bool),
                       system.eff("tp_overlap", 0.0), 0.0)
    hidden_by = overlap * (3 * f_dense + np.where(full, f_dense, 0))
    block_comm = np.maximum(0.0, fwd_comm + bwd_comm + recompute_comm - hidden_by)
    # Context parallelism's own cost: the exposed K/V exchange and, where the run is a ring of
    # partial attentions (native with cp_exchange "ring": PyTorch's context_parallel), merging
    # them in fp32.
    ring = cp_ring(t, cp_exchange)
    fwd_merge, bwd_merge = cp_merge_bytes(model, t, e, ring, cp_heads)
    merge_replay = np.where(t.recompute == Recompute.NONE.code, 0.0, fwd_merge)
    cp_comm = (cp_exchange_times(model, system, t, e, f_attn, ring, eager, cp_heads)
               + (fwd_merge + bwd_merge + merge_replay) / r.memory)
    # The all-to-alls, exposed beyond the compute they overlap with (costmodel/moe.py).
    compute = 3 * fwd + recompute + attn_bwd_extra
    ep_comm = (moe.all_to_all_times(model, system, t, e, moe_run, compute)
               if model.is_moe else 0.0)
    return BlockTimes(f_dense, f_attn, f_elem, f_softmax, f_fixed, fwd, recompute,
                      compute, block_comm, cp_comm, ep_comm, attn_bwd_extra)


def kv_exchange_bytes(model: ModelSpec, t: LayoutTable, act_bytes,
                      cp_heads: int | None = None) -> np.ndarray:
    """Bytes of K and V one rank holds for its ``seq/cp`` tokens of one micro-batch and layer
    (``2·(seq/cp)·b·kv/t`` elements, ``kv`` the K/V width: grouped-query attention exchanges
    only its kv heads, Megatron-LM's CP documentation): the unit both exchanges move.
    ``cp_heads``: the K/V heads SDPA receives where the run's model code expands them first
    (:func:`~frontier_llm.costmodel.gemm.sdpa_kv_width_per_rank`); PyTorch's CP ring works on
    SDPA's inputs, so it gathers, sends and accumulates them all. None: the model's kv heads
    (torchtitan v0.2.2, which flm renders, passes ``enable_gqa``)."""
    kv = sdpa_kv_width_per_rank(model, t.tp, cp_heads)
    return 2 * t.local_seq(model.seq_len) * t.micro_batch * kv * act_bytes


def cp_exchange_times(model: ModelSpec, system: SystemSpec, t: LayoutTable, act_bytes,
                      f_attn, ring=None, eager: bool = False, cp_heads: int | None = None
                      ) -> np.ndarray:
    """Exposed seconds of the context-parallel K/V exchange per layer and micro-batch (forward,
    backward and any recompute). The cp group is the ``cp`` ranks ``tp`` apart (cp is next to
    tp in the rank order of torchtitan's mesh ``[pp, dp_replicate, dp_shard, cp, tp]`` and
    Megatron's ``tp-cp-ep-dp-pp``), spanning ``tp·cp`` consecutive ranks, which sets its link.
    The rings compute attention as ``cp`` partial attentions of ``1/cp`` of the rank's
    attention work each (the load-balanced split: flops.causal_pairs_per_cp_rank), the first on
    the rank's own K/V; the ring's slowest hop is the wrap-around between the first and the
    last cp rank (``tp·(cp−1)`` apart). ``ring``: which native rows run PyTorch's ring
    (:func:`~frontier_llm.costmodel.behaviour.cp_ring`; default the engine's rule).

    - ``native``, ``cp_exchange`` "gather" (flm bench, bench/context_parallel.py; Llama 3's
      all-gather CP, Dubey et al. 2024 §3.3.2): K and V all-gathered before one attention of
      the local queries over the whole sequence, exposed (attention waits for them); dK and dV
      reduce-scattered in backward, exposed. A block replayed in backward gathers again: full
      recompute, and op-level selective, whose policy keeps the attention kernel's output but
      not the collective's, so the replay reruns the gather to rebuild the kernel's saved
      inputs. Selective recompute (the attention core) keeps its inputs, the gathered K/V: no
      second gather. Each collective moves the full-length K and V, ``cp`` times
      :func:`kv_exchange_bytes`.
    - ``native``, ``cp_exchange`` "ring" (the torchtitan flm renders,
      ``context_parallel_rotate_method = "allgather"``, torchtitan's default:
      torchtitan/config_manager.py at 9dec370; PyTorch's
      ``context_parallel``, torch/distributed/tensor/experimental/_attention.py at 0123248a,
      ``_templated_ring_attention`` and ``_AllGatherRotater``): forward launches one
      all-gather of every rank's K/V before the first partial attention and waits for it at
      the second, so the gather hides behind ``1/cp`` of the attention; backward gathers K/V
      again the same way (behind ``1/cp`` of the backward attention, twice the forward's) and
      passes the dK/dV accumulators round the cp ring (``_templated_ring_attention_backward``:
      ``dkv_rotater`` is ``ALL_TO_ALL``, the buffers fp32 as ``convert_to_f32`` defaults): ``cp``
      sends of fp32 dK and dV, each but the last behind the next partial backward, the last
      waited after the loop. A block replayed in backward gathers again: full recompute, and
      op-level selective, whose policy keeps the attention kernel's output but not the
      collective's (torchtitan's save list). Selective recompute (the attention core) keeps
      its inputs, the gathered K/V: no second gather. That overlap is the eager ring's
      (``eager``): compiled, nothing overlaps. torchtitan compiles each block whole
      (``torch.compile(transformer_block, fullgraph=True)``: parallelize_llama.py at 9dec370,
      llama3/infra/parallelize.py at v0.2.2), so the ring is traced into the block's graph,
      and a functional collective traced returns only after ``wait_tensor``
      (torch/distributed/_functional_collectives.py ``_maybe_wrap_tensor``, the same from
      2023 to 2.13), with Inductor's reordering passes off by default
      (``reorder_for_compute_comm_overlap = False``): every gather and every dK/dV send
      waits before the next partial attention is issued. The unit the ring moves is
      :func:`kv_exchange_bytes` (``cp_heads``: the K/V heads its SDPA receives).
    - ``megatron`` (TransformerEngine ring attention, ``cp_comm_type`` p2p; Liu et al. 2023's
      ring): ``cp−1`` steps, each sending the K/V block on to the next rank while attention runs
      on the block in hand (``1/cp`` of the rank's attention): a step exposes ``max(0, send −
      attention step)``. Backward passes K/V and dK/dV (twice the bytes) beside twice the
      compute; full and selective recompute (Megatron checkpoints the core attention, the ring
      included) run the forward ring again.
    """
    n = t.cp
    chunk = kv_exchange_bytes(model, t, act_bytes)
    ring_chunk = kv_exchange_bytes(model, t, act_bytes, cp_heads)
    full = t.recompute == Recompute.FULL.code
    if ring is None:
        ring = cp_ring(t)
    hop = t.tp * (n - 1)
    step_fwd = f_attn / n
    gather = comm.all_gather(system, n, t.tp, n * ring_chunk)
    gather_fwd = np.maximum(0.0, gather - step_fwd)
    grads = comm.send_recv(system, hop, ring_chunk * 4.0 / act_bytes)  # fp32 dK and dV
    native_bwd = (np.maximum(0.0, gather - 2 * step_fwd)
                  + (n - 1) * np.maximum(0.0, grads - 2 * step_fwd) + grads)
    again = full | (t.recompute == Recompute.SELECTIVE_OP.code)
    torch_ring = gather_fwd + native_bwd + np.where(again, gather_fwd, 0.0)
    if not eager:
        torch_ring = 2 * gather + n * grads + np.where(again, gather, 0.0)
    bench_gather = comm.all_gather(system, n, t.tp, n * chunk)
    bench = (bench_gather + comm.reduce_scatter(system, n, t.tp, n * chunk)
             + np.where(again, bench_gather, 0.0))
    native = np.where(ring, torch_ring, bench)
    fwd = (n - 1) * np.maximum(0.0, comm.send_recv(system, hop, chunk) - step_fwd)
    bwd = (n - 1) * np.maximum(0.0, comm.send_recv(system, hop, 2 * chunk) - 2 * step_fwd)
    ring = fwd + bwd + np.where(full | (t.recompute == Recompute.SELECTIVE.code), fwd, 0.0)
    exposed = np.where(t.engine == Engine.MEGATRON.code, ring, native)
    return np.where(n > 1, exposed, 0.0)


def cp_merge_bytes(model: ModelSpec, t: LayoutTable, act_bytes, ring=None,
                   cp_heads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) HBM bytes one rank moves per layer and micro-batch merging the
    ``cp`` partial attentions of PyTorch's ``context_parallel`` (native rows whose exchange is
    the ring, ``ring``, default :func:`~frontier_llm.costmodel.behaviour.cp_ring`; 0 for flm
    bench's single attention, the other engines and cp 1), beside the attention kernels themselves
    (torch/distributed/tensor/experimental/_attention.py at 0123248a: ``_SDPAMerger`` and
    ``_templated_ring_attention_backward``, ``convert_to_f32 = True`` by default).

    Forward: the first partial output is converted to fp32 (read ``e``, write 4 bytes per
    element), each of the ``cp−1`` others is folded into the fp32 running output (read 4 and
    ``e``, write 4: ``out − sigmoid(lse_i − lse)·(out − out_i)``, one pass when compiled, more
    when eager), and the result is cast back (read 4, write ``e``): ``o·(cp·(8+e) + e)``, ``o``
    the rank's output elements (``b·(s/cp)·heads·v_dim/t``). The slowest rank (the last, whose
    every later partial spans its whole output) sets the pace. Backward: dQ, dK and dV
    accumulate in fp32: zero-filled (write 4), each of the ``cp`` partial backwards adds its
    gradient (read 4 and ``e``, write 4), cast back at the end (read 4, write ``e``):
    ``(q + kv)·(cp·(8+e) + 8 + e)``. The log-sum-exp rows (``1/head_dim`` of the output) and
    the eager code's extra copies (``torch.cat`` of the buffers each step) are left out: this is
    the least traffic the merge needs. A replayed block merges its forward again (the caller).
    ``cp_heads``: the K/V heads the ring accumulates dK/dV over (:func:`kv_exchange_bytes`)."""
    n = np.asarray(t.cp)
    e = np.asarray(act_bytes, dtype=float)
    tokens = t.micro_batch * t.local_seq(model.seq_len)
    heads = model.heads / t.tp
    out = tokens * heads * (model.out_dim / model.heads)
    q = tokens * heads * (model.q_dim / model.heads)
    kv = kv_exchange_bytes(model, t, act_bytes, cp_heads) / e  # K and V elements
    fwd = out * (n * (8 + e) + e)
    bwd = (q + kv) * (n * (8 + e) + 8 + e)
    ring = cp_ring(t) if ring is None else ring
    return np.where(ring, fwd, 0.0), np.where(ring, bwd, 0.0)


def stage_times(model: ModelSpec, system: SystemSpec, t: LayoutTable, r: _Rates,
                blk: BlockTimes, p2p_overlap: bool = False,
                moe_run: moe.MoeRun = moe.NO_OVERLAP) -> StageTimes:
    """The pipeline ranks (the last with the head) and the schedule's pipeline time: the slowest
    rank sets the pace, the mean the bubble. Ranks hold the layers the engine's split gives them
    (costmodel/split.py): ``l/p`` each when even. ``p2p_overlap``: the run overlaps its
    interleaved schedule's sends and receives with the neighbouring chunks' compute
    (Megatron-Core's ``overlap_p2p_comm``, "valid only when virtual_pipeline_model_parallel_size
    is larger than 1" as NeMo's MLPerf configs say); off, every send is exposed. Under DualPipe
    (``moe_run.overlap``) every rank holds two stages, each run for half the micro-batches
    (moe.dualpipe_pace), and the bubble is DualPipe's (moe.dualpipe_bubble_share)."""
    h, V = model.hidden, model.vocab
    tp, pp, v = t.tp, t.pp, t.virtual_stages
    tokens = t.micro_batch * t.local_seq(model.seq_len)  # the rank's share of each sequence
    ranks = pipeline_ranks(model, t)
    head_flops = logits_forward_flops_per_token(model) * tokens / tp
    loss_bytes = tokens * V / tp * 4 * 3  # fp32 logits: cast, softmax, gradient
    last_extra = 3 * head_flops / r.flops + loss_bytes / r.memory
    last_extra = last_extra + comm.all_reduce(system, tp, 1, tokens * 4 * 3)  # CE statistics
    # Pipeline neighbours are tp·cp·dp ranks apart (pp is outermost in the rank order).
    message = comm.send_recv(system, axes.rank_stride(t, axes.Axis.PP),
                             tokens * h * r.act_bytes / tp)
    p2p, p2p_last = deepspeed_pipe_p2p(system, t, message, tokens * h * r.act_bytes)
    megatron_p2p = 2 * v * message
    per_layer = blk.compute + blk.comm + blk.cp_comm + blk.ep_comm
    if p2p_overlap:
        # Overlapped sends hide behind the compute of the rank's chunks for that micro-batch,
        # never more than it lasts (as TP overlap behind its GEMMs, block_times).
        hides = p2p_acts_on(t)
        megatron_p2p = np.where(hides, np.maximum(
            0.0, megatron_p2p - np.minimum(ranks["most_but_last"], ranks["last"])
            * blk.compute), megatron_p2p)
    p2p = np.where(pp > 1, np.where(t.engine == Engine.DEEPSPEED.code, p2p, megatron_p2p), 0.0)
    p2p_last = np.where(pp > 1, np.where(t.engine == Engine.DEEPSPEED.code, p2p_last,
                                         megatron_p2p), 0.0)
    # Multi-token prediction (model.mtp_layers) runs on the last stage (Megatron-Core builds
    # every module there): per module one more block, its 2h -> h projection and another head
    # pass with its loss.
    mtp = model.mtp_layers
    proj = 3 * 2 * (2 * h) * h * tokens / tp / r.flops
    last_extra = (1 + mtp) * last_extra + mtp * (per_layer + proj)
    others = ranks["most_but_last"] * per_layer + p2p
    last = ranks["last"] * per_layer + last_extra + p2p_last
    last_paces = (last >= others) | (pp == 1)
    layers = np.where(last_paces, ranks["last"], ranks["most_but_last"])
    head = np.where(last_paces, last_extra, 0.0)
    p2p = np.where(last_paces, p2p_last, p2p)
    t_max = layers * per_layer + head + p2p
    t_avg = np.where(pp > 1, (model.layers * per_layer + last_extra) / pp + p2p, t_max)
    bubble = (pp - 1) / v * t_avg
    if moe_run.overlap == "dualpipe":
        dual = pp > 1
        d_layers, d_head = moe.dualpipe_pace(ranks, per_layer, last_extra)
        layers = np.where(dual, d_layers, layers)
        head = np.where(dual, d_head, head)
        t_max = layers * per_layer + head + p2p
        bubble = np.where(dual, moe.dualpipe_bubble_share(pp) * t_avg, bubble)
    compute_mb = layers * blk.compute + np.where(pp > 1, 0.0, last_extra)
    m = t.num_microbatches
    return StageTimes(layers, head, p2p, compute_mb, m * t_max + bubble, bubble)


def deepspeed_pipe_p2p(system: SystemSpec, t: LayoutTable, message, full_bytes
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Seconds per micro-batch of DeepSpeed's PipelineEngine exchanging activations (pp > 1):
    (a middle or first rank, the last rank).

    ``TrainSchedule`` (deepspeed/runtime/pipe/schedule.py) runs a forward step as ``SendGrad``
    to the previous stage then ``RecvActivation`` from it, and a backward step as ``RecvGrad``
    from the next stage then ``SendActivation`` to it; each is a blocking ``p2p.send`` /
    ``p2p.recv`` (runtime/pipe/p2p.py: ``dist.send``/``dist.recv``, no ``async_op``), so a
    micro-batch's four messages follow one another on the critical path, where Megatron-LM's
    1F1B sends and receives each pair at once (two message times, ``message`` one). A rank
    sends three of them (first and last stage: two). With tensor parallelism
    (``pipe_partitioned`` and ``grad_partitioned``, True by default: runtime/config.py) each
    message is the rank's 1/t slice and the receiver rebuilds the whole ``b·s·h`` tensor by an
    all-gather over its TP group (``PartitionedTensor.full()``, runtime/pipe/engine.py): the
    received input before the forward, the stage's own output and the received gradient before
    the backward; the last stage, which neither partitions an output nor receives a gradient,
    rebuilds only its input. (Checked in deepspeed 0.19.8; the schedule and the partitioning
    are those of the 2020 engine the BigScience and MT-NLG runs used.)"""
    gather = comm.all_gather(system, t.tp, 1, full_bytes)
    return 4 * message + 3 * gather, 2 * message + gather


def reduce_bytes(t: LayoutTable, reduce_fp32: bool | None = None) -> np.ndarray:
    """Bytes per gradient element on the wire: fp32 where the engine reduces in fp32 (or the
    training is fp32), else the 16-bit training dtype. ``reduce_fp32`` (None: the engine's rule)
    says it for the run instead (an FSDP mixed-precision policy's ``reduce_dtype``)."""
    return np.where(reduces_fp32(t, reduce_fp32), 4, ACT_BYTES[t.dtype])


def sharded_param_times(model: ModelSpec, system: SystemSpec, t: LayoutTable,
                        blk: BlockTimes, layers, n_stage,
                        reduce_fp32: bool | None = None, reduce: bool = True) -> np.ndarray:
    """Exposed seconds per micro-batch of sharded parameters (ZeRO-3, FSDP, AMSP partial):
    each layer's parameters all-gathered over the ``kp`` ranks that shard them before its
    forward, again before its backward when the engine reshards after forward, and its
    gradients reduce-scattered over the same group after its backward. With prefetch the next
    layer's gather runs during this layer's compute, so a layer exposes ``max(0, comm −
    compute)``, plus the first gather and the last reduce-scatter whole; without prefetch every
    gather is exposed (and every reduce-scatter too unless the engine issues them
    asynchronously in buckets). The embeddings and head are gathered and reduced whole
    (exposed). Group shape and per-message start-up come from :mod:`.comm` (a group inside a
    node uses the node link). ``reduce`` False: a micro-batch whose gradients are not
    reduce-scattered (kept unsharded until the last one's, ``set_requires_gradient_sync``)."""
    kp = t.degree("params")
    e = fp8.param_gather_bytes(t, ACT_BYTES[t.dtype])
    g = reduce_bytes(t, reduce_fp32)
    n_layer = table_layer_params(model, t)
    n_rest = np.maximum(n_stage - layers * n_layer, 0)
    # Messages per layer: one gather per module for engines that fetch module by module, and
    # one reduce-scatter per gradient bucket: each pays the start-up cost ((n−1)·α on a ring),
    # which is what dominates at large kp and small messages.
    per_module = behaviour(t, "gather_per_module")
    gathers = np.where(per_module, layer_modules(model), 1)
    bucket_rs = behaviour(t, "reduce_bucket_params")
    scatters = np.where(bucket_rs > 0, np.ceil(n_layer / np.maximum(bucket_rs, 1)), 1)
    # One flat buffer per layer (FSDP) spreads over the node's NICs (comm.link_for_span);
    # DeepSpeed ZeRO-3's module-by-module gathers are issued parameter by parameter, each
    # waited for (deepspeed/runtime/zero/stage3.py: the "async" gather synchronised the device,
    # DeepSpeed issue #1069 and PR #1188), measured through one NIC's rate (Narayanan et al.
    # 2021's ZeRO-3 rows, docs/costmodel.md "Data-parallel communication").
    rails = ~per_module
    ag = gathers * comm.all_gather(system, kp, t.tp, n_layer * e / gathers, rails)
    rs = scatters * comm.reduce_scatter(system, kp, t.tp, n_layer * g / scatters, rails)
    rest = comm.all_gather(system, kp, t.tp, n_rest * e, rails) + comm.reduce_scatter(
        system, kp, t.tp, n_rest * g, rails) * reduce
    rs = rs * reduce
    # Parameters freed after forward are gathered again in backward (kept: no second gather).
    again = np.where(behaviour(t, "reshard_after_forward") & t.reshard_after_forward, ag, 0.0)
    fwd_window = blk.fwd
    bwd_window = blk.compute - blk.fwd  # backward and any recompute
    # The share of a layer's gather issued ahead: all of it, or what the engine's prefetch
    # bucket holds; the rest is gathered on demand (exposed). The reduce-scatter of the layer
    # before runs behind this layer's backward either way (bucketed, asynchronous).
    bucket = behaviour(t, "prefetch_bucket_params")
    ahead = np.where(behaviour(t, "prefetch") > 0,
                     np.where(bucket > 0, np.minimum(1.0, bucket / n_layer), 1.0), 0.0)
    fwd = (1 - ahead) * ag + np.maximum(0.0, ahead * ag - fwd_window)
    # Reduce-scatters run asynchronously behind the backward where the engine buckets them
    # (FSDP2, DeepSpeed's overlap_comm), sharing the window with the prefetched gather.
    bwd = np.where(behaviour(t, "gradient_bucketing"),
                   (1 - ahead) * again + np.maximum(0.0, ahead * again + rs - bwd_window),
                   (1 - ahead) * again + np.maximum(0.0, ahead * again - bwd_window) + rs)
    exposed = ag + rs + (layers - 1) * (fwd + bwd) + rest  # first gather, last reduce-scatter
    return np.where(kp > 1, exposed, 0.0)


def data_parallel_times(model: ModelSpec, system: SystemSpec, t: LayoutTable, r: _Rates,
                        blk: BlockTimes, stage: StageTimes, overlap_comm: bool = True,
                        reduce_fp32: bool | None = None,
                        grad_sync: bool | None = None) -> dict[str, np.ndarray]:
    """Exposed gradient/parameter communication and the optimizer step. ``overlap_comm``
    False: DeepSpeed's ZeRO-1/2 reduce on the compute stream (a ds_config that leaves
    ``overlap_comm`` unset: DeepSpeed's default below stage 3), nothing hidden.
    ``reduce_fp32``: :func:`reduce_bytes`."""
    tp, pp = t.tp, t.pp
    # Gradients are reduced over every rank holding the same parameters: dp x cp (the cp ranks
    # saw other tokens of the same sequences), a group of stride tp (cp next to tp, dp next to
    # cp in the rank order: comm.py).
    dp = t.shard_ranks
    m = t.num_microbatches
    ranks = pipeline_ranks(model, t)
    n_layer = table_layer_params(model, t)
    n_stage = np.maximum.reduce([
        stage_params_per_rank(model, tp, pp, 0, ranks["first"], n_layer),
        stage_params_per_rank(model, tp, pp, ranks["mid"], ranks["mid_held"], n_layer),
        stage_params_per_rank(model, tp, pp, pp - 1, ranks["last"], n_layer)])
    # DeepSpeed's PipelineEngine (pp > 1) turns the engine's backward-hook reduction off
    # (``enable_backward_allreduce = False``, deepspeed/runtime/pipe/engine.py) and reduces as
    # the schedule's last instructions, after the pipeline has drained (TrainSchedule's
    # ReduceTiedGrads, ReduceGrads, OptimizerStep: runtime/pipe/schedule.py): nothing hides
    # behind a backward. Under BF16_Optimizer (memory.bf16_optimizer_states: DeepSpeed's own
    # choice for bf16 with a pipeline at ZeRO stage 0, or a run stating fp32 accumulation) the
    # schedule all-reduces the whole accumulator (``_bf16_reduce_grads`` ->
    # ``buffered_allreduce_fallback`` -> ``get_grads_for_reduction``, runtime/pipe/engine.py
    # l.287-298, engine.py l.3921-3935) in :func:`reduce_bytes`, and the tied embedding's
    # ``_hp_grad`` between the first and last stage.
    kp, kg, ko = t.degree("params"), t.degree("grads"), t.degree("optim")
    sync_each = grad_sync_each(t, grad_sync)  # before ``grad_sync`` names the seconds below
    pipe = (t.engine == Engine.DEEPSPEED.code) & (pp > 1)
    bf16_opt, accum = bf16_optimizer_states(t, reduce_fp32)
    # BF16_Optimizer steps Adam on the rank's 1/dp partition of its fp32 master even at ZeRO
    # stage 0 (its memory, memory.state_bytes), then all-gathers the updated bf16 partitions over
    # the data-parallel group (``update_lp_params`` -> ``all_gather_dp_groups``,
    # runtime/bf16_optimizer.py l.593-603), as ZeRO-1 does.
    opt_part = LayoutTable(**{**t.columns(), "optim_kind": np.where(
        bf16_opt, PlacementKind.FULL.code, t.optim_kind)}).degree("optim")
    ko = np.where(bf16_opt, np.maximum(ko, opt_part), ko)
    grad_bytes = n_stage * reduce_bytes(t, reduce_fp32)
    param_bytes = n_stage * fp8.param_gather_bytes(t, STATE_BYTES[t.dtype][:, 0])
    shard = np.maximum(kg, ko)
    # Gradients once per step: reduce-scatter inside a sharding group and all-reduce of the shard
    # across groups (HSDP's replication; a plain all-reduce when nothing is sharded). With
    # sharded parameters the reduce-scatter ran per micro-batch (sharded_param_times) and only
    # the cross-group all-reduce is left.
    # Bucketed gradients and parameters spread over the node's NICs (comm.link_for_span).
    # An engine may all-reduce the whole gradient and keep its shard (DeepSpeed ZeRO-1/2's
    # multi-rank buckets) instead of reduce-scattering it.
    in_group = np.where(behaviour(t, "sharded_grad_all_reduce"),
                        comm.all_reduce(system, shard, tp, grad_bytes, True),
                        comm.reduce_scatter(system, shard, tp, grad_bytes, True))
    grad_sync = np.where(
        shard > 1,
        np.where(kp > 1, 0.0, in_group)
        + comm.all_reduce(system, dp // shard, tp * shard, grad_bytes / shard, True),
        comm.all_reduce(system, dp, tp, grad_bytes, True),
    )
    # Parameters updated from sharded optimizer states are gathered back (kept less sharded).
    param_gather = np.where(
        (shard > 1) & (kp < shard),
        comm.all_gather(system, shard // kp, tp * kp, param_bytes / kp, True), 0.0)
    # Bucketed engines (Megatron's --overlap-grad-reduce / --overlap-param-gather, DDP and
    # FSDP's per-layer buckets, DeepSpeed's overlap_comm) reduce a layer's gradients while the
    # earlier layers' backward runs and gather parameters behind the next forward: what shows is
    # the part longer than that compute plus the last bucket (one layer's share). Without
    # bucketing all of it shows, and so does what the engine issues outside the overlap
    # (DeepSpeed: ZeRO-0's all-reduce after backward, the parameter gather inside its step).
    layers = stage.layers
    bwd_mb = layers * (blk.compute - blk.fwd)
    fwd_mb = layers * blk.fwd
    last = 1.0 / np.maximum(layers, 1)
    bucketing = behaviour(t, "gradient_bucketing")
    if not overlap_comm:
        bucketing = bucketing & ~((t.engine == Engine.DEEPSPEED.code) & (kp == 1))
    grad_hidden = bucketing & np.where(shard > 1, True, behaviour(t, "replicated_grad_overlap"))
    grad_hidden = grad_hidden & ~pipe
    grad_exposed = np.where(grad_hidden, np.maximum(0.0, grad_sync * (1 - last) - bwd_mb)
                            + grad_sync * last, grad_sync)
    # Sharded gradients reduced after every micro-batch (DeepSpeed ZeRO-2), each behind that
    # micro-batch's backward.
    each = behaviour(t, "sharded_grad_each_microbatch") & (kg > 1) & (kp == 1)
    grad_exposed = np.where(each, m * grad_exposed, grad_exposed)
    gather_hidden = bucketing & behaviour(t, "param_gather_overlap")
    gather_exposed = np.where(gather_hidden, np.maximum(0.0, param_gather * (1 - last) - fwd_mb)
                              + param_gather * last, param_gather)
    # The tied embedding's gradient, all-reduced over its two holders (first and last stage,
    # (pp - 1) stages of world_size / pp ranks apart), exposed, by DeepSpeed's pipeline (above);
    # Megatron's embedding all-reduce is its own small step too, but no row prices it yet.
    tied = comm.all_reduce(system, 2, (pp - 1) * (t.world_size // pp),
                           model.vocab * model.hidden / tp * reduce_bytes(t, reduce_fp32))
    tied_exposed = np.where(pipe & model.tied_embeddings, tied, 0.0)
    dp_exposed = grad_exposed + gather_exposed + tied_exposed
    # Sharded parameters: every micro-batch gathers; its gradients are reduce-scattered after
    # each micro-batch or only after the last (the trainer's setting, memory.grad_sync_each).
    synced = sharded_param_times(model, system, t, blk, layers, n_stage, reduce_fp32)
    unsynced = sharded_param_times(model, system, t, blk, layers, n_stage, reduce_fp32,
                                   reduce=False)
    fsdp_exposed = np.where(sync_each, m * synced,
                            (m - 1) * unsynced + synced)
    optimizer = np.ceil(n_stage / ko) * OPTIMIZER_TRAFFIC[t.dtype] / r.memory
    # BF16_Optimizer (PR #1801, "bf16+pipeline parallelism", the branch BLOOM trained on): after
    # every micro-batch's backward the stage's 16-bit gradients are added into its accumulator,
    # parameter by parameter (``update_hp_grads``: ``hp_grad.add_(lp.grad.to(hp_grad.dtype))``,
    # runtime/bf16_optimizer.py l.508-539; pipe/engine.py l.839-863) and zeroed before the next
    # (``clear_lp_grads``): HP_GRAD_ACCUMULATE_BYTES into fp32, LP_GRAD_ACCUMULATE_BYTES into
    # bf16, on every backward of the critical path (m + p - 1 of them); a bf16 accumulator is
    # cast to fp32 for the step (LP_GRAD_CAST_BYTES on the partition).
    per_mb = np.where(accum == 4, HP_GRAD_ACCUMULATE_BYTES, LP_GRAD_ACCUMULATE_BYTES)
    accumulate = np.where(bf16_opt, (m + pp - 1) * n_stage * per_mb / r.memory, 0.0)
    cast = np.where(bf16_opt & (accum < 4), np.ceil(n_stage / ko) * LP_GRAD_CAST_BYTES
                    / r.memory, 0.0)
    optimizer = optimizer + accumulate + cast
    return {"dp_comm": dp_exposed + fsdp_exposed, "optimizer": optimizer}


def step_time(model: ModelSpec, system: SystemSpec, t: LayoutTable, eager: bool = False,
              overlap_comm: bool = True, reduce_fp32: bool | None = None,
              tp_comm_overlap: bool = False,
              moe_run: moe.MoeRun = moe.NO_OVERLAP, grad_sync: bool | None = None,
              p2p_overlap: bool = False, cp_exchange: str | None = None,
              cp_heads: int | None = None) -> dict[str, np.ndarray]:
    """Seconds per iteration and its parts (seconds, summed over the iteration, on the slowest
    pipeline stage), for every layout of ``t``: per block, per stage, data parallel. ``eager``:
    the run is un-compiled PyTorch (:func:`block_times`); ``overlap_comm``: DeepSpeed's, for
    its ZeRO-1/2 layouts (:func:`data_parallel_times`); ``reduce_fp32``: :func:`reduce_bytes`;
    ``tp_comm_overlap`` and ``moe_run``: :func:`block_times`; ``grad_sync``: sharded gradients
    reduce-scattered every micro-batch or at the last (None: the engine's rule,
    :func:`~frontier_llm.costmodel.memory.grad_sync_each`); ``p2p_overlap``:
    :func:`stage_times`; ``cp_exchange``: the native engine's context-parallel exchange,
    "gather" or "ring" (None: the engine's rule,
    :func:`~frontier_llm.costmodel.behaviour.cp_ring`); ``cp_heads``: the K/V heads that ring
    exchanges (:func:`kv_exchange_bytes`; None: the model's kv heads)."""
    r = _rates(model, system, t)
    blk = block_times(model, system, t, r, eager, tp_comm_overlap, moe_run, cp_exchange,
                      cp_heads)
    stage = stage_times(model, system, t, r, blk, p2p_overlap, moe_run)
    dp = data_parallel_times(model, system, t, r, blk, stage, overlap_comm, reduce_fp32,
                             grad_sync)
    m = t.num_microbatches
    layers = stage.layers * m
    return {
        "step_time": stage.pipeline + dp["dp_comm"] + dp["optimizer"],
        "compute": layers * (3 * (blk.dense + blk.attn) + blk.attn_bwd_extra),
        "elementwise": layers * 3 * (blk.elem + blk.softmax + blk.fixed),
        "recompute": layers * blk.recompute,
        "tp_comm": layers * blk.comm,
        "cp_comm": layers * blk.cp_comm,
        "ep_comm": layers * blk.ep_comm,
        "pp_comm": m * stage.p2p,
        "pp_bubble": stage.bubble,
        "head": m * stage.head,
        "dp_comm": dp["dp_comm"],
        "optimizer": dp["optimizer"],
    }
