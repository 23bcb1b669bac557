"""Per-rank memory: model states, saved activations, communication buffers.

Model states (Rajbhandari et al. 2020, ZeRO): mixed-precision Adam keeps a 16-bit parameter, a
gradient and fp32 master weight + two moments. Megatron accumulates gradients in fp32 for bf16,
so bf16/fp16 is 2 + 4 + 12 = 18 bytes per parameter; fp32 training is 4 + 4 + 8 = 16. Each
component is divided by its AMSP sharding degree (ZeRO-1/2/3 are presets).

Saved activations (Korthikanti et al. 2022, arXiv 2205.05198, §4): per layer and micro-batch
``s·b·h·(34 + 5·a·s/h)`` bytes in 16-bit with dropout; the terms are built here tensor by tensor
so that tensor parallelism (``10 + 24/t``), sequence parallelism (everything ``/t``), selective
recompute or flash attention (no ``a·s²`` terms), full recompute (the layer input only),
grouped-query attention, SwiGLU, no dropout and fp32 all follow from the same count. The pipeline
schedule sets how many micro-batches a stage holds: GPipe all ``m``; 1F1B ``p − r`` on stage
``r``; interleaved 1F1B ``(v−1)·p + 2·(p−1−r) + 1`` chunks (``p·(1 + (p−1)/(p·v))`` micro-batches
of a stage on the first one); DualPipe (``--moe-overlap dualpipe``) two stages a rank, ``P − h``
and ``h + 1`` micro-batches of them (:func:`dualpipe_memory`). The first stage adds token ids
and the embedding dropout mask; the last stage the final norm and the fp32 logits of the
cross-entropy (``4·s·b·V/t`` bytes per micro-batch, kept for every micro-batch under GPipe).

The figure predicted is the allocator's peak reserved (``torch.cuda.max_memory_reserved``) at the
start of the backward pass: beside the above, the loss's vocabulary-sized temporaries
(:func:`loss_bytes`), the unsharded copies of sharded parameters and gradients
(:func:`gathered_bytes`, from the engine's prefetch and resharding) and the system's reserve.
The native engine's is the larger of that, under FSDP2 a block's own backward
(:mod:`.block_backward`), and its optimizer step (:func:`rank_memory`).
Ranks hold the layers their engine's split gives them (:mod:`.split`); the peak is over the first,
the fullest middle and the last rank. docs/costmodel.md §3.

Context parallelism (``cp``): a rank holds ``seq_len/cp`` tokens of each sequence, so every
token-proportional term above is taken at that length; under the ``native`` engine flm bench's
single gather also keeps the all-gathered K and V its attention ran on (:func:`gathered_kv_bytes`)
and its masks (:func:`cp_mask_bytes`), where PyTorch's ring (``cp_exchange`` "ring") keeps only
the local flash-attention tensors and holds one layer's exchange in backward
(:func:`cp_ring_backward_bytes`); model states are sharded over dp x cp
(``LayoutTable.degree``). docs/costmodel.md "Context parallelism".
"""

from __future__ import annotations

import numpy as np

from frontier_llm.costmodel import fp8, moe
from frontier_llm.costmodel.behaviour import (
    behaviour,
    bf16_optimizer,
    cp_gather,
    cp_ring,
    reduces_fp32,
)
from frontier_llm.costmodel.block_backward import block_moment, mlp_backward_bytes, priced
from frontier_llm.costmodel.checkpoint_policy import kept_bytes_per_token
from frontier_llm.costmodel.deepspeed_buffers import (
    extra_optimizer_bytes,
    extra_param_bytes,
    extra_params,
    grad_bytes_per_param,
    zero3_live_params,
)
from frontier_llm.costmodel.gemm import sdpa_kv_width_per_rank
from frontier_llm.costmodel.layouts import LayoutTable, from_configs
from frontier_llm.costmodel.params import (
    kv_width_per_rank,
    layer_params_per_rank,
    stage_params_per_rank,
    table_layer_params,
)
from frontier_llm.costmodel.reserve import reserve_terms
from frontier_llm.costmodel.split import pipeline_ranks, rank_layers, rank_moe_blocks
from frontier_llm.specs.layout import DType, Engine, Layout, PlacementKind, Recompute, Schedule
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec

# Bytes per parameter for (parameters, gradients, optimizer states), indexed by DType code.
# FP8 training keeps bf16 training's states and activations; its FP8 copies are costmodel/fp8.py's.
STATE_BYTES = np.array([{DType.FP32: [4, 4, 8], DType.BF16: [2, 4, 12],
                         DType.FP16: [2, 4, 12], DType.FP8: [2, 4, 12]}[d] for d in DType])
ACT_BYTES = np.array([{DType.FP32: 4, DType.BF16: 2, DType.FP16: 2, DType.FP8: 2}[d]
                      for d in DType])
MASK_BYTES = 1  # dropout masks are bytes (Korthikanti et al. 2022 §4.1)


def _cdiv(a, b):
    return -(-a // b)


# DeepSpeed's BF16_Optimizer (deepspeed/runtime/bf16_optimizer.py, DeepSpeed 0.19.8) keeps, per
# parameter of the rank's stage: the bf16 parameters in one flat buffer (``bf16_groups_flat``,
# the parameters made views of it); their bf16 ``.grad``, which autograd allocates and
# ``clear_lp_grads`` only zeroes before each micro-batch's backward (``set_to_none=False``:
# ``backward_prologue``, pipe/engine.py ``_exec_backward_pass``) until ``zero_grad`` frees it
# after the step (with ``bf16.immediate_grad_update`` off, DeepSpeed's default and flm's config;
# on, a hook frees each ``.grad`` once added: ``accumulate_hp_grads_and_remove_lp``); a whole,
# unpartitioned gradient accumulator (``fp32_groups_gradients_flat =
# torch.zeros_like(self.bf16_groups_flat[i], dtype=self.grad_acc_dtype)``) the ``.grad`` is
# added into after every micro-batch (``update_hp_grads``); and only the rank's 1/dp partition
# of the fp32 master (``fp32_groups_flat_partition``) and, through it, of Adam's two moments,
# over the data-parallel group (``dp_process_group=self.seq_data_parallel_group``). The
# accumulator's dtype is the engine's ``grad_accum_dtype`` (runtime/engine.py
# ``get_data_types``): the model's, bf16, unless the config's ``data_types.grad_accum_dtype``
# says fp32 (flm's exports leave it unset: measured 2 bytes on a real BF16_Optimizer,
# tests/test_bench_deepspeed.py).
BF16_OPT_LP_GRAD_BYTES = 2
BF16_OPT_MASTER_BYTES = 4 + 4 + 4  # fp32 master partition + Adam's exp_avg and exp_avg_sq


def bf16_optimizer_states(t: LayoutTable, reduce_fp32: bool | None = None
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Which layouts of ``t`` DeepSpeed trains with BF16_Optimizer and the bytes per parameter
    of its gradient accumulator. DeepSpeed 0.19.8 runtime/engine.py ``_do_optimizer_sanity_check``
    picks it for bf16 with a pipeline and no ZeRO (:func:`bf16_optimizer`, accumulating in bf16
    unless the run states fp32, ``reduce_fp32`` True, as the BigScience fork's hard-coded fp32
    buffer is) and for bf16 ZeRO-1 with ``grad_accum_dtype == torch.float32`` (a DeepSpeed run
    at ZeRO stage 1 whose gradients are stated reduced in fp32: BLOOM's and LUMI's
    Megatron-DeepSpeed rows); ZeRO-2/3 keep the ZeRO optimizer."""
    fp32 = np.full(len(t), reduce_fp32 is not None and bool(reduce_fp32))
    zero1 = ((t.params_kind == PlacementKind.REPLICATE.code)
             & (t.grads_kind == PlacementKind.REPLICATE.code)
             & (t.optim_kind != PlacementKind.REPLICATE.code))
    stated = ((t.engine == Engine.DEEPSPEED.code) & (t.dtype == DType.BF16.code) & zero1 & fp32)
    return bf16_optimizer(t) | stated, np.where(fp32, 4, 2)


def state_bytes(model: ModelSpec, t: LayoutTable, pp_rank, held=None,
                reduce_fp32: bool | None = None, fp8_params: bool | None = None
                ) -> dict[str, np.ndarray]:
    """Parameters, gradients and optimizer-state bytes on one rank of stage ``pp_rank``, which
    holds ``held`` layers (default: its share of the engine's split); DeepSpeed's extra
    parameters and copies come from costmodel/deepspeed_buffers.py. ``reduce_fp32`` False:
    Megatron's gradient buffer in the training dtype (``grad_reduce_in_fp32=False``, as NeMo's
    MLPerf runs set it); ``fp8_params``: :func:`~frontier_llm.costmodel.fp8.fp8_params`."""
    if held is None:
        held = rank_layers(model, t, pp_rank)[0]
    n = (stage_params_per_rank(model, t.tp, t.pp, pp_rank, held, table_layer_params(model, t))
         + extra_params(model, t, pp_rank))
    per = STATE_BYTES[t.dtype]
    if model.is_moe:
        # The rank's own MoE blocks rather than the mean block (costmodel/moe.py, split.py):
        # DeepSeek-V3's dense first blocks sit on the first stage.
        more, more_routed = moe.stage_excess_params(model, t, held,
                                                    layer_params_per_rank(model, t.tp),
                                                    rank_moe_blocks(model, t, pp_rank))
        n = n + more
        routed = held * moe.routed_params_per_rank(model, t) + more_routed

    def shard(comp: str):
        if not model.is_moe:
            return _cdiv(n, t.degree(comp))
        # Routed experts shard over expert-dp at most (costmodel/moe.py).
        return moe.sharded_count(n, routed, t, comp)

    native = t.engine == Engine.NATIVE.code
    # The native engine (flm bench, FSDP2) stores a parameter shard wherever gradients are
    # sharded (ZeRO-2 is ``fully_shard(reshard_after_forward=False)``: its whole parameters are
    # a gathered copy, in ``buffers``), and keeps gradients in the parameters' dtype (autograd's;
    # FSDP2 without a MixedPrecisionPolicy reduces in it too); its fp32 master weights are the
    # optimizer's (bench/optim.py ``LocalAdam``). Measured by flm memcheck
    # (tests/test_memcheck_grid.py).
    params_n = np.where(native, shard("grads"), shard("params"))
    grad_bytes = np.where(native, per[:, 0], grad_bytes_per_param(t, per[:, 1]))
    # Megatron-Core allocates its gradient buffer in fp32 when ``grad_reduce_in_fp32`` and in
    # the parameters' dtype otherwise (DistributedDataParallel's ``grad_dtype``,
    # megatron/core/distributed/distributed_data_parallel.py); Megatron-LM sets it for bf16
    # unless --grad-reduce-in-bf16 (the engine's rule), NeMo's MLPerf scripts turn it off.
    if reduce_fp32 is not None and not reduce_fp32:
        grad_bytes = np.where(t.engine == Engine.MEGATRON.code,
                              np.minimum(grad_bytes, per[:, 0]), grad_bytes)
    # BF16_Optimizer (:func:`bf16_optimizer_states`): the bf16 ``.grad`` beside a whole
    # accumulator, and the master and moments over the data-parallel group even at ZeRO stage 0,
    # as ZeRO-1 partitions them (routed experts over expert-dp: ``real_dp_process_group``).
    bf16_opt, accum = bf16_optimizer_states(t, reduce_fp32)
    grad_bytes = np.where(bf16_opt, BF16_OPT_LP_GRAD_BYTES + accum, grad_bytes)
    optim = shard("optim") * per[:, 2]
    if bf16_opt.any():
        zero1 = LayoutTable(**{**t.columns(), "optim_kind": np.where(
            bf16_opt, PlacementKind.FULL.code, t.optim_kind)})
        part = (moe.sharded_count(n, routed, zero1, "optim") if model.is_moe
                else _cdiv(n, zero1.degree("optim")))
        optim = np.where(bf16_opt, part * BF16_OPT_MASTER_BYTES, optim)
    # FP8 parameters (costmodel/fp8.py): the linear weights held in 1 byte, not the 16-bit 2;
    # their count on the rank is its blocks' linear parameters (not sharded: ZeRO-1).
    linear = np.asarray(held) * layer_params_per_rank(model, t.tp)
    fp8_saving = np.where(fp8.fp8_params(t, fp8_params), linear * (per[:, 0] - 1), 0)
    return {
        "params": (params_n * per[:, 0] + extra_param_bytes(t, n, per[:, 0])
                   - np.where(params_n == n, fp8_saving, 0)),
        "grads": shard("grads") * grad_bytes,
        # DeepSpeed's fp32 master partition (costmodel/deepspeed_buffers.py).
        "optimizer": optim + extra_optimizer_bytes(t, n),
        "count": n,
        "local": shard("grads"),
    }


def layer_activation_bytes(model: ModelSpec, t: LayoutTable, rebuilt: bool = False,
                           cp_exchange: str | None = None,
                           cp_heads: int | None = None) -> np.ndarray:
    """Bytes one transformer block saves for backward per micro-batch (no recompute); with
    ``rebuilt``, those of a block being rebuilt in backward, which keeps the unfused attention
    scores whatever the recompute mode. Computed once per table and model (every pipeline rank
    reads both). ``cp_exchange``: the native engine's context-parallel exchange (None: the
    engine's rule; behaviour.cp_ring). ``cp_heads``: the K/V heads SDPA receives, which a
    fused kernel saves (None: the model's kv heads)."""
    memo = t.__dict__.get("_layer_activations")
    key = (cp_exchange, cp_heads)
    if memo is None or memo[0] is not model or memo[1] != key:
        memo = (model, key, _layer_activation_bytes(model, t, cp_exchange, cp_heads))
        t.__dict__["_layer_activations"] = memo
    return memo[2][1] if rebuilt else memo[2][0]


def _layer_activation_bytes(model: ModelSpec, t: LayoutTable, cp_exchange: str | None = None,
                            cp_heads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(saved, rebuilt) bytes of :func:`layer_activation_bytes`."""
    e = ACT_BYTES[t.dtype]
    tp = t.tp
    s, b, h, f = model.seq_len, t.micro_batch, model.hidden, model.ffn_hidden
    # Context parallelism: a rank holds seq_len/cp tokens of each sequence, so every
    # token-proportional tensor is divided by cp (docs/costmodel.md, "Context parallelism").
    sb = t.local_seq(s) * b
    rep = np.where(t.sequence_parallel, 1.0 / tp, 1.0)  # the parts TP alone leaves whole
    q, f_rank, heads = model.q_dim / tp, f / tp, model.heads / tp
    # The attention output's width; V's is kv's scaled by v_dim/kv_dim (both 1 but under MLA,
    # whose per-head V is narrower than its K; its small latents are not counted).
    out, v_scale = model.out_dim / tp, model.v_dim / model.kv_dim
    drop = MASK_BYTES if model.dropout > 0 else 0
    stats = 8 if model.norm == "layernorm" else 4  # fp32 mean and rstd (or rstd) per token
    # Two norm inputs, the QKV and MLP inputs (norm outputs), two residual dropout masks.
    # Engines differ in one saved tensor: with sequence parallelism Megatron (and
    # Megatron-DeepSpeed) saves the 1/t shard of a column-parallel linear's input and gathers it
    # again in backward; PyTorch's DTensor (``native``, flm bench) saves the gathered input.
    linear_in = np.where(t.engine == Engine.NATIVE.code, 1.0, rep)
    # TransformerEngine under FP8 saves each linear layer's input as its FP8 cast, 1 byte an
    # element (costmodel/fp8.py): the QKV and MLP inputs here, the projection's and the second
    # MLP matrix's inputs below.
    lin = fp8.linear_input_bytes(t, e)
    whole = sb * (rep * (2 * e * h + 2 * drop * h + 2 * stats) + linear_in * 2 * lin * h)
    # fc1 out + act out | gate, up, silu, prod. Megatron's SwiGLU is one fused autograd function
    # (``--bias-swiglu-fusion``, on by default; NeMo's Llama configs set bias_activation_fusion)
    # that saves only its input, gate and up, and recomputes silu in backward (SwiGLUFunction,
    # megatron/core/fusions/fused_bias_swiglu.py at b1030e9): gate, up, prod.
    swiglu_saved = np.where(t.engine == Engine.MEGATRON.code, 3, 4)
    mlp_saved = 2 if model.activation == "gelu" else swiglu_saved
    # The unfused core's matmuls save K and V after grouped-query expansion to every query head
    # (flm bench's and Megatron's unfused attention repeat them); flash attention and the
    # attention-core checkpoint (selective) keep them unexpanded.
    # PyTorch's CP ring dispatches only the flash, memory-efficient and cuDNN kernels
    # (_context_parallel/_attention.py ``_sdpa_handler``): a ring layout is priced fused.
    fused = t.flash_attention | cp_ring(t, cp_exchange)
    # A fused kernel saves the K and V it is given (aten ``_scaled_dot_product_flash_attention``
    # keeps its query, key, value, output and log-sum-exp for backward). torchtitan before
    # ff0829c (9dec370 torchtitan/models/llama/model.py) hands SDPA K/V already repeated to every
    # query head (``repeat_kv``: unsqueeze, expand, then a reshape that copies), so the copies
    # are what is saved; the unrepeated rotary output is saved by nothing (the repeat's
    # backward is a sum needing no input, the rotary product's a multiply by the constant
    # frequencies). ``cp_heads`` states that count.
    fused_kv = sdpa_kv_width_per_rank(model, tp, cp_heads)
    kv_saved = np.where(~fused & (t.recompute != Recompute.SELECTIVE.code), q, fused_kv)
    # Q, K | V | projection input | MLP
    # The activation's output (the last of ``mlp_saved``) is the second matrix's input.
    split = sb * (e * ((q + kv_saved) + kv_saved * v_scale + (mlp_saved - 1) * f_rank)
                  + lin * (out + f_rank))
    split = split + gathered_kv_bytes(model, t, kv_saved, cp_exchange)
    if model.is_moe:  # router logits, permuted tokens, expert intermediates (costmodel/moe.py)
        split = split + sb * moe.activation_extra(model, t, e, f_rank)
    # Q·Kᵀ softmax output, its dropout mask and output; flash attention and selective recompute
    # keep none of them (flash keeps a fp32 log-sum-exp per row instead). With cp the local
    # queries (seq/cp rows) meet every key of the sequence (seq columns): (seq/cp) x seq per
    # head, under either engine's exchange.
    scores = heads * s * sb * (e + (drop + e if drop else 0))
    unfused_scores = np.where(fused, 0, scores)
    lse = np.where(fused, 4 * heads * sb, 0)
    rebuilt = whole + split + unfused_scores + lse
    return rebuilt - np.where(t.recompute == Recompute.NONE.code, 0, unfused_scores), rebuilt


def gathered_kv_bytes(model: ModelSpec, t: LayoutTable, kv_saved=None,
                      cp_exchange: str | None = None) -> np.ndarray:
    """Bytes flm bench's context-parallel attention (the native engine, ``cp_exchange``
    "gather") saves beyond the rank's own K and V, per layer and micro-batch: it all-gathers K
    and V over the cp group before one attention over the whole sequence (Llama 3's all-gather
    CP, Dubey et al. 2024 §3.3.2; bench/context_parallel.py), and autograd saves the
    attention's inputs, the full-length K and V: ``seq·b·kv/t`` elements each, of which the
    layer's own ``seq/cp`` share is already counted. PyTorch's ring (``cp_exchange`` "ring")
    saves the aten flash-attention op's inputs and outputs, the local Q, K, V, output and
    log-sum-exp (its CP dispatch runs below autograd: _context_parallel/_attention.py
    ``_sdpa_handler``), all counted already: nothing more. Megatron (TransformerEngine's ring,
    ``cp_comm_type`` p2p) saves only its local K/V chunk and passes the others around the ring
    again in backward (Megatron-LM docs/source/api-guide/context_parallel.rst): nothing more.
    ``kv_saved`` is the width saved per K or V (expanded to every query head by the unfused
    core); default the unexpanded width."""
    e = ACT_BYTES[t.dtype]
    if kv_saved is None:
        kv_saved = kv_width_per_rank(model, t.tp)
    others = (model.seq_len - t.local_seq(model.seq_len)) * t.micro_batch
    return np.where(cp_gather(t, cp_exchange), 2 * others * e * kv_saved, 0)


def _in_flight_chunks(t: LayoutTable, pp_rank) -> np.ndarray:
    """Chunks of layers (a whole stage unless interleaved) held on stage ``pp_rank`` at peak."""
    m, p, v = t.num_microbatches, t.pp, t.virtual_stages
    r = np.asarray(pp_rank)
    gpipe = m
    one_f_one_b = np.minimum(m, p - r)
    interleaved = np.minimum(m * v, (v - 1) * p + 2 * (p - 1 - r) + 1)
    chunks = np.select([t.schedule == Schedule.GPIPE.code, t.schedule == Schedule.ONE_F_ONE_B.code],
                       [gpipe, one_f_one_b], interleaved)
    return chunks


def activation_bytes(model: ModelSpec, t: LayoutTable, pp_rank, chunk=None,
                     cp_exchange: str | None = None) -> np.ndarray:
    """Peak bytes saved for backward on one rank of stage ``pp_rank``, whose fullest chunk
    holds ``chunk`` layers (default: from the engine's split). ``cp_exchange``: the native
    engine's context-parallel exchange (None: the engine's rule)."""
    return parts_total(activation_parts(model, t, pp_rank, chunk, cp_exchange))


def parts_total(parts: dict[str, np.ndarray]) -> np.ndarray:
    """The activation peak of :func:`activation_parts`: the head's tensors (logits) are freed
    by its backward before any layer is rebuilt, or its attention backward holds PyTorch's CP
    ring's exchange."""
    return (parts["steady"] + parts["mtp"]
            + np.maximum(parts["transient"] + parts["ring"], parts["head"]))


def activation_parts(model: ModelSpec, t: LayoutTable, pp_rank, chunk=None,
                     cp_exchange: str | None = None, in_flight=None,
                     cp_heads: int | None = None) -> dict[str, np.ndarray]:
    """:func:`activation_bytes` by part: ``steady`` (every in-flight block's saved tensors, the
    first stage's inputs, cp masks), ``head`` (the last stage's norm and logits), ``mtp``
    (its multi-token prediction modules'), ``transient`` (a block rebuilt in backward beyond
    what it kept), ``ring`` (one layer's attention backward under PyTorch's CP ring) and
    ``per_layer`` (what one block keeps). ``in_flight``: micro-batches of ``chunk`` layers held
    at the peak instead of the layout's schedule's (DualPipe's, :func:`dualpipe_memory`).
    ``cp_heads``: the K/V heads SDPA receives, saved by a fused kernel
    (:func:`layer_activation_bytes`) and held by PyTorch's CP ring
    (:func:`cp_ring_backward_bytes`)."""
    if chunk is None:
        chunk = rank_layers(model, t, pp_rank)[1]
    e = ACT_BYTES[t.dtype]
    r = np.asarray(pp_rank)
    s, b, h = model.seq_len, t.micro_batch, model.hidden
    sb = t.local_seq(s) * b  # the rank's share of each sequence (cp)
    rep = np.where(t.sequence_parallel, 1.0 / t.tp, 1.0)
    chunks = _in_flight_chunks(t, r) if in_flight is None else np.asarray(in_flight)
    layers_per_chunk = chunk  # every chunk in flight counted as the rank's fullest
    full = layer_activation_bytes(model, t, cp_exchange=cp_exchange, cp_heads=cp_heads)
    # Full recompute keeps only each layer's input, and rebuilds one layer at a time (its input
    # is then part of the rebuilt layer); op-level selective keeps the input and what its policy
    # saves (costmodel/checkpoint_policy.py), and rebuilds the rest of one layer at a time.
    # With cp under flm bench's gather, the rebuilt layer gathers K and V again (part of
    # ``rebuilt``).
    is_full = t.recompute == Recompute.FULL.code
    is_op = t.recompute == Recompute.SELECTIVE_OP.code
    layer_input = sb * h * e * rep
    op_kept = layer_input + sb * kept_bytes_per_token(model, t.tp, e, t.flash_attention)
    per_layer = np.select([is_full, is_op], [layer_input, op_kept], full)
    # A block rebuilt in backward (full or op-level recompute) runs the unfused attention core
    # again, which saves its s x s scores until its backward (flm bench measures it:
    # test_bench_checkpoint_policy.py).
    rebuilt = layer_activation_bytes(model, t, rebuilt=True, cp_exchange=cp_exchange,
                                     cp_heads=cp_heads)
    transient = np.where(is_full | is_op, np.maximum(rebuilt - per_layer, 0), 0)
    layers = chunks * layers_per_chunk
    micro_in_flight = np.where((t.schedule == Schedule.INTERLEAVED.code) & (in_flight is None),
                               _cdiv(chunks, t.virtual_stages), chunks)
    drop = MASK_BYTES if model.dropout > 0 else 0
    first = np.where(r == 0, micro_in_flight * sb * (8 + drop * h * rep), 0)
    # The native engine's later stages keep each in-flight micro-batch's received input (the
    # receive buffer is the graph's input until its backward), as flm memcheck measures.
    received = np.where((r > 0) & (t.engine == Engine.NATIVE.code),
                        micro_in_flight * sb * h * e * rep, 0)
    first = first + received
    stats = 8 if model.norm == "layernorm" else 4
    # The last stage's logits of every micro-batch in flight there: all under GPipe, one under
    # 1F1B (and interleaving, whose last chunk runs each backward at once), DualPipe's count.
    logits_mb = (np.where(t.schedule == Schedule.GPIPE.code, t.num_microbatches, 1)
                 if in_flight is None else np.asarray(in_flight))
    last = np.where(
        r == t.pp - 1,
        logits_mb * sb * (e * h * rep + stats * rep + e * h + 4 * _cdiv(model.vocab, t.tp)),
        0,
    )
    # Multi-token prediction on the last stage: per module and micro-batch in flight there, a
    # block's saved tensors, the 2h-wide projection input and its own fp32 logits (kept until
    # the backward reaches them, like the main head's).
    mtp = np.where(r == t.pp - 1, model.mtp_layers * logits_mb * (
        per_layer + sb * 2 * h * e * rep + sb * 4 * _cdiv(model.vocab, t.tp)), 0)
    return {"steady": layers * per_layer + first + cp_mask_bytes(model, t, cp_exchange),
            "head": last, "mtp": mtp, "transient": transient,
            "ring": cp_ring_backward_bytes(model, t, cp_exchange, cp_heads),
            "per_layer": per_layer}


def cp_mask_bytes(model: ModelSpec, t: LayoutTable, cp_exchange: str | None = None
                  ) -> np.ndarray:
    """flm bench's context-parallel attention masks (the native engine, ``cp_exchange``
    "gather"): one ``(s/cp) x s`` table of which global keys each local query may see, kept for
    the whole step and shared by every layer (bench/context_parallel.py ``CPContext``): the
    boolean table, and the additive one in the training dtype that the fused kernel takes (the
    unfused path: its boolean complement). At 131,072 tokens over cp 8 that is 6 GiB in bf16,
    measured by flm memcheck. PyTorch's ring keeps none: each partial attention is causal or
    whole (``_is_causal_behavior``), no mask."""
    e = ACT_BYTES[t.dtype]
    per_entry = 1 + np.where(t.flash_attention, e, 1)
    return np.where(cp_gather(t, cp_exchange),
                    per_entry * t.local_seq(model.seq_len) * model.seq_len, 0)


def cp_ring_backward_bytes(model: ModelSpec, t: LayoutTable, cp_exchange: str | None = None,
                           cp_heads: int | None = None) -> np.ndarray:
    """What PyTorch's CP ring (native, ``cp_exchange`` "ring") holds during one layer's
    attention backward beyond the saved tensors, per micro-batch
    (_context_parallel/_attention.py ``_templated_ring_attention_backward``, torch 2.13.0 at
    cf30153c): the all-gathered K/V of every cp rank (``cp`` units of the rank's K and V, the
    ``_AllGatherRotater`` buffer) and the local K/V concatenated to send (one unit); dQ, dK and
    dV accumulated in fp32 (``convert_to_f32``); the fp32 dK/dV being passed round the ring,
    the concatenated send and the received buffer (``_AllToAllRotater``); one partial
    attention's dQ, dK, dV in the training dtype. 0 for every other layout. ``cp_heads``: the
    K/V heads SDPA receives and the ring holds (steptime.kv_exchange_bytes; None: the model's kv
    heads; torchtitan before ff0829c repeats K/V to every query head)."""
    e = ACT_BYTES[t.dtype]
    tokens = t.local_seq(model.seq_len) * t.micro_batch
    q = tokens * model.q_dim / t.tp
    kv = 2 * tokens * sdpa_kv_width_per_rank(model, t.tp, cp_heads)  # K and V elements
    held = (np.asarray(t.cp) + 1) * kv * e + 4 * (q + kv) + 2 * 4 * kv + e * (q + kv)
    return np.where(cp_ring(t, cp_exchange), held, 0)


def gathered_bytes(model: ModelSpec, t: LayoutTable, pp_rank=0, held=None,
                   reduce_fp32: bool | None = None) -> np.ndarray:
    """Unsharded copies of sharded parameters (ZeRO-3, FSDP, AMSP partial) at the start of
    backward, when the loss temporaries are alive too: the layer in use plus the ``prefetch``
    layers gathered ahead (every layer of the stage when the engine keeps them between forward
    and backward) with one layer's unsharded gradient (plus its fp32 copy where the engine
    reduces in fp32) until it is reduce-scattered, and the stage's embeddings / head (FSDP's root
    unit), gathered with their gradient."""
    e = ACT_BYTES[t.dtype]
    n_layer = table_layer_params(model, t)
    layers = rank_layers(model, t, pp_rank)[0] if held is None else held
    n_rest = np.maximum(
        stage_params_per_rank(model, t.tp, t.pp, pp_rank, layers, n_layer) - layers * n_layer, 0)
    # Resharded after forward (the engine's way, and the layout's choice): the layer in use and
    # those prefetched; kept: every layer of the stage, gathered since its forward.
    held = np.where(behaviour(t, "reshard_after_forward") & t.reshard_after_forward,
                    np.minimum(1 + behaviour(t, "prefetch"), layers), layers)
    fp32_copy = np.where(reduces_fp32(t, reduce_fp32) & (e < 4), 4, 0)
    # DeepSpeed ZeRO-3 gathers module by module up to its live-parameter bound, and reduces
    # gradients through a bucket of ``reduce_bucket_size`` elements rather than a layer's whole
    # gradient (costmodel/deepspeed_buffers.py).
    ds = t.engine == Engine.DEEPSPEED.code
    live = np.where(ds, zero3_live_params(model, t, n_layer, held,
                                          behaviour(t, "prefetch_bucket_params")),
                    held * n_layer)
    bucket = behaviour(t, "reduce_bucket_params")
    reducing = np.where(ds & (bucket > 0), np.minimum(n_layer, bucket), n_layer)
    unsharded = live * e + reducing * (e + fp32_copy) + n_rest * (2 * e + fp32_copy)
    return np.where(t.degree("params") > 1, unsharded, 0)


def loss_bytes(model: ModelSpec, t: LayoutTable) -> np.ndarray:
    """Temporaries of the loss backward on the last stage, per vocabulary entry and token: the
    saved fp32 log-probabilities are in the activations; PyTorch's ``cross_entropy`` (native)
    then allocates the fp32 gradient of the log-probabilities and the fp32 gradient of its input
    (8 bytes) while they are alive; Megatron's vocab-parallel cross-entropy computes the gradient
    in place in the saved softmax and casts it to the training dtype (``e`` bytes)."""
    # Under tp > 1 the native engine's loss is PyTorch's ``loss_parallel``: its backward
    # (torch/distributed/tensor/parallel/loss.py ``_nll_loss_and_log_softmax_backward``) builds
    # ``zeros_like(x)``, ``exp(x)`` and their sum before scaling: three fp32 shards (measured
    # with real tensors and by flm memcheck).
    native = t.engine == Engine.NATIVE.code
    per_vocab = np.where(native, np.where(t.tp > 1, 12, 8), ACT_BYTES[t.dtype])
    return t.local_seq(model.seq_len) * t.micro_batch * _cdiv(model.vocab, t.tp) * per_vocab


def buffer_bytes(model: ModelSpec, t: LayoutTable, pp_rank=0, held=None,
                 reduce_fp32: bool | None = None) -> np.ndarray:
    """Transient communication buffers: gathered parameters and gradients of sharded layers and
    the sequence-parallel all-gather of one layer input (the rank's seq/cp tokens).
    ``reduce_fp32``: whether gradients are reduced in fp32 (None: the engine's rule)."""
    e = ACT_BYTES[t.dtype]
    sp = np.where(t.sequence_parallel,
                  e * t.local_seq(model.seq_len) * t.micro_batch * model.hidden, 0)
    return gathered_bytes(model, t, pp_rank, held, reduce_fp32) + sp


def grad_sync_each(t: LayoutTable, grad_sync: bool | None = None) -> np.ndarray:
    """Whether sharded gradients are reduce-scattered after every micro-batch (None: the
    engine's rule, ``fsdp_grad_sync_each_microbatch``; a trainer's own: GRAD_SYNC_EACH in
    specs/engine_rules.py)."""
    rule = behaviour(t, "fsdp_grad_sync_each_microbatch")
    each = rule if grad_sync is None else np.full(len(t), bool(grad_sync))
    # Under a native pipeline the stage's backward never syncs before its last micro-batch:
    # torch's PipelineStage (torch/distributed/pipelining/stage.py ``backward_maybe_with_nosync``,
    # torch 2.13) calls ``set_requires_gradient_sync(False)`` on an FSDP2 stage for every
    # backward and reduces after the schedule, whatever the trainer's own loop does.
    return each & ~((t.engine == Engine.NATIVE.code) & (t.pp > 1))


def native_buffer_bytes(model: ModelSpec, t: LayoutTable, pp_rank, states: dict,
                        grad_sync: bool | None = None, earlier=None,
                        reduce_fp32: bool | None = None) -> np.ndarray:
    """The native engine's (FSDP2's) unsharded copies at its backward peak: with
    ``reshard_after_forward`` off every parameter of the stage stays gathered from forward to
    backward; with more than one micro-batch the gradients accumulate unsharded until the last
    one (flm bench syncs them once, ``set_requires_gradient_sync``); on a stage without the
    loss, the layer in backward holds its gathered parameters and their gradient. The last
    stage's peak is its loss's backward, when every layer is resharded (the root too: flm bench
    passes ``reshard_after_forward`` to it). ``earlier``: whether a backward ran before the
    rank's peak (default: its schedule's, :func:`_earlier_backward`). ``reduce_fp32`` True: the
    run states an FSDP2 ``MixedPrecisionPolicy`` reducing in fp32 (torchtitan's
    ``mixed_precision_reduce``), so a 16-bit accumulated gradient is held in fp32; flm bench sets
    no policy and accumulates in the training dtype (None, the default)."""
    e = ACT_BYTES[t.dtype]
    r = np.asarray(pp_rank)
    sharded = t.degree("grads") > 1
    n = states["count"]
    if earlier is None:
        earlier = _earlier_backward(t, r)
    # torch's PipelineStage neither reduces nor reshards an FSDP2 stage after a backward until
    # its last one (torch/distributed/pipelining/stage.py ``backward_maybe_with_nosync``): the
    # gradients accumulate unsharded as without a pipeline; the parameters a backward left
    # gathered are resharded again after the next forward, before the peak.
    kept = (t.params_kind == PlacementKind.REPLICATE.code) | ~t.reshard_after_forward
    whole = np.where(kept, n * e, 0)
    # A trainer that reduce-scatters after every micro-batch (torchtitan) keeps only the sharded
    # gradient between them (counted in ``grads``), no unsharded one.
    # FSDP2 keeps a gradient accumulated without sync in its policy's ``reduce_dtype`` where
    # that differs (torch 2.13 ``_fsdp_param.py`` ``to_accumulated_grad_if_needed``:
    # ``unsharded_grad.to(self.reduce_dtype)``).
    acc_e = np.where((reduce_fp32 is True) & (e < 4), 4, e)
    accumulated = np.where(earlier & ~grad_sync_each(t, grad_sync), n * acc_e, 0)
    return np.where(sharded, whole + accumulated, 0)


def _earlier_backward(t: LayoutTable, pp_rank) -> np.ndarray:
    """Whether a micro-batch's backward has run before the rank's backward peak: the peak is
    the first backward after the most micro-batches in flight (all of them under GPipe,
    ``p - r`` under 1F1B, one without a pipeline), and later ones return to that many only
    if more micro-batches follow."""
    m = t.num_microbatches
    flight = np.where(t.pp == 1, 1, _in_flight_micro_batches(t, pp_rank))
    return m > flight


def _in_flight_micro_batches(t: LayoutTable, pp_rank) -> np.ndarray:
    chunks = _in_flight_chunks(t, pp_rank)
    return np.where(t.schedule == Schedule.INTERLEAVED.code,
                    _cdiv(chunks, t.virtual_stages), chunks)


def native_backward_bytes(model: ModelSpec, t: LayoutTable, pp_rank) -> np.ndarray:
    """The native engine's backward temporaries on a stage without the loss: one block's
    MLP backward holds the gradients of its ``f/t``-wide intermediates (SwiGLU's gate, up and
    product; GELU's input and output), measured by flm memcheck; on the last stage the loss's
    temporaries (:func:`loss_bytes`) are larger and come first."""
    return np.where(np.asarray(pp_rank) == t.pp - 1, 0,
                    mlp_backward_bytes(model, t, ACT_BYTES[t.dtype]))


def native_embedding_grad_bytes(model: ModelSpec, t: LayoutTable, pp_rank) -> np.ndarray:
    """Under tp > 1 the native engine's vocabulary-parallel embedding (DTensor's
    ``RowwiseParallel``) leaves its gradient replicated, every vocabulary row on every tp rank,
    until the step keeps the rank's rows (bench/engine.py ``_settle_grads``): the rows beyond
    the rank's share, on the first stage."""
    e = ACT_BYTES[t.dtype]
    rows = model.vocab - _cdiv(model.vocab, t.tp)
    return np.where((np.asarray(pp_rank) == 0) & (t.tp > 1), rows * model.hidden * e, 0)


def _block_backward(model: ModelSpec, t: LayoutTable, r, states: dict, held, parts: dict,
                    grads_back, buffers, earlier, grad_sync: bool | None) -> dict:
    """The terms of the native engine's largest block-backward moment under FSDP2
    (costmodel/block_backward.py), from this module's parts: a block's and the root's
    parameters on the rank, a block's sharded gradient, the block's input gradient (its
    output's width, sharded like the block's input under sequence parallelism)."""
    e = ACT_BYTES[t.dtype]
    n_layer = table_layer_params(model, t)
    layers = np.asarray(held)
    n_rest = np.maximum(
        stage_params_per_rank(model, t.tp, t.pp, r, layers, n_layer) - layers * n_layer, 0)
    sb = t.local_seq(model.seq_len) * t.micro_batch
    rep = np.where(t.sequence_parallel, 1.0 / t.tp, 1.0)
    return block_moment(
        layers=layers, block_params=n_layer, rest_params=n_rest,
        grad_shard_bytes=_cdiv(n_layer, t.degree("grads")) * e, act_bytes=e,
        per_layer=parts["per_layer"], steady=parts["steady"], transient=parts["transient"],
        grad_in=sb * model.hidden * e * rep, mlp_temps=mlp_backward_bytes(model, t, e),
        # The head's weight (or the embedding it is tied to), vocabulary-parallel, and the
        # MLP's last matrix, both unsharded.
        weight_grads=(_cdiv(model.vocab, t.tp) + model.ffn_hidden // t.tp) * model.hidden * e,
        grads_back=grads_back, loss_buffers=buffers, earlier=earlier,
        reduces_each=grad_sync_each(t, grad_sync),
        kept=(t.params_kind == PlacementKind.REPLICATE.code) | ~t.reshard_after_forward)


def native_step_bytes(t: LayoutTable, states: dict) -> np.ndarray:
    """What the native engine's optimizer step (bench/optim.py ``LocalAdam``) allocates beyond
    the model states: an fp32 copy of 16-bit gradients and Adam's fp32 denominator
    (``_foreach_sqrt``) per local parameter; under ZeRO-1 the fp32 flat gradient of every local
    parameter and the fp32 all-gather of the updated ones instead (8 bytes per parameter)."""
    e = ACT_BYTES[t.dtype]
    local = states["local"]
    zero1 = (t.optim_kind != PlacementKind.REPLICATE.code) & (t.degree("grads") == 1)
    return np.where(zero1, 8 * states["count"], local * (np.where(e < 4, 4, 0) + 4))


def rank_memory(model: ModelSpec, system: SystemSpec, t: LayoutTable, pp_rank, held=None,
                chunk=None, reduce_fp32: bool | None = None, phase: str | None = None,
                grad_sync: bool | None = None, fp8_params: bool | None = None,
                cp_exchange: str | None = None, cp_heads: int | None = None) -> dict:
    """Every memory term of one rank of stage ``pp_rank`` (holding ``held`` layers, its fullest
    chunk ``chunk``; default: from the engine's split), and their total ``peak``.

    The terms are those at the rank's peak. Megatron-LM and DeepSpeed keep their gradient
    buffers from the start (both allocate them with the model), so their peak is the start of
    backward with every term. The native engine (autograd, FSDP2) creates gradients in backward
    and frees them after the step, so its peak is the larger of two moments: the backward
    (gradients held only when an earlier micro-batch left them) and the optimizer step
    (gradients and the step's temporaries, ``step``; no activation then). The backward's is
    the loss's backward or, under FSDP2, a block's own backward (its gathered parameters, the
    root's, a prefetched block or a reduce-scatter input, its gradients and rebuilt tensors:
    costmodel/block_backward.py), whichever holds more. flm memcheck measures them
    (docs/costmodel.md, "Memory as the allocator sees it"). ``phase`` (``backward``, ``loss``
    for the loss's backward alone, or ``step``) gives that moment's terms instead of the
    larger's.
    ``cp_exchange``: the native engine's context-parallel exchange (None: the engine's rule;
    behaviour.cp_ring); ``cp_heads``: the K/V heads SDPA receives (:func:`activation_parts`)."""
    if held is None or chunk is None:
        held, chunk = rank_layers(model, t, pp_rank)
    r = np.asarray(pp_rank)
    return _assemble(model, system, t, r, held,
                     state_bytes(model, t, pp_rank, held, reduce_fp32, fp8_params),
                     activation_parts(model, t, pp_rank, chunk, cp_exchange,
                                      cp_heads=cp_heads),
                     r == t.pp - 1, buffer_bytes(model, t, pp_rank, held, reduce_fp32),
                     _earlier_backward(t, r), phase, grad_sync, fp8_params, reduce_fp32)


def _assemble(model: ModelSpec, system: SystemSpec, t: LayoutTable, r, held, states: dict,
              parts: dict, holds_last, buffers, earlier, phase: str | None,
              grad_sync: bool | None, fp8_params: bool | None,
              reduce_fp32: bool | None = None) -> dict:
    """:func:`rank_memory`'s terms from a rank's states, activation parts, whether it holds the
    last stage (the loss), its non-native buffers and whether an earlier micro-batch's backward
    ran before its peak; shared by the 1F1B-family ranks and DualPipe's
    (:func:`dualpipe_memory`)."""
    native = t.engine == Engine.NATIVE.code
    sharded = t.degree("grads") > 1
    activations = parts_total(parts)
    loss = np.where(holds_last, loss_bytes(model, t), 0)
    # The native engine's sequence-parallel all-gather output is the linear's saved input
    # (DTensor keeps the gathered one: in the activations), not a buffer of its own.
    buffers = np.where(native, native_buffer_bytes(model, t, r, states, grad_sync, earlier,
                                                   reduce_fp32), buffers)
    # Sharded gradients are held at the backward peak once an earlier micro-batch's
    # reduce-scatter left them (a trainer that syncs every micro-batch); flm bench's are the
    # unsharded ones in ``buffers`` until its last micro-batch.
    sharded_held = sharded & earlier & grad_sync_each(t, grad_sync)
    # The embedding's replicated gradient rows (tp > 1) outlive a backward only where nothing
    # shards them: FSDP2's reduce-scatter of the root leaves the rank's shard (measured by flm
    # memcheck, 22B tp 2 x dp 8 reducing every micro-batch: the stage's sharded gradients only).
    grads_back = np.where(native & ((sharded & ~sharded_held) | ~earlier), 0,
                          states["grads"] + np.where(native & ~sharded,
                                                     native_embedding_grad_bytes(model, t, r),
                                                     0))
    loss = np.where(native & ~np.asarray(holds_last),
                    np.maximum(loss, native_backward_bytes(model, t, r)), loss)
    # FSDP2's second backward moment, a block's own backward (costmodel/block_backward.py):
    # where it holds more than the loss's, it is the backward's peak.
    block = _block_backward(model, t, r, states, held, parts, grads_back, buffers, earlier,
                            grad_sync)
    at_block = (priced(model, t) & (phase != "loss")
                & (sum(block.values()) > grads_back + activations + loss + buffers))
    grads_back = np.where(at_block, block["grads"], grads_back)
    activations = np.where(at_block, block["activations"], activations)
    loss = np.where(at_block, block["loss"], loss)
    buffers = np.where(at_block, block["buffers"], buffers)
    step = np.where(native, native_step_bytes(t, states), 0)
    backward = grads_back + activations + loss + buffers
    at_step = native & (states["grads"] + step > backward)
    if phase is not None:
        at_step = np.full(len(t), phase == "step") & native
    zero = np.zeros(len(t))
    out = {
        "params": states["params"],
        "grads": np.where(at_step, states["grads"], grads_back),
        "optimizer": states["optimizer"],
        "activations": np.where(at_step, zero, activations),
        "loss": np.where(at_step, zero, loss),
        "buffers": np.where(at_step, zero, buffers),
        "step": np.where(at_step, step, zero),
        "fp8": fp8.extra_bytes(model, t, held, fp8_params),
    }
    # The reserve (costmodel/reserve.py): the allocator's fragmentation over the allocated
    # peak, the context and the collective buffers beside it; ``reserved`` is their sum.
    allocated = sum(np.asarray(v, dtype=float) for v in out.values())
    parts = reserve_terms(system, t, allocated)
    out["reserved"] = sum(parts.values())
    out["peak"] = allocated + out["reserved"]
    out.update(parts)
    return out


def dualpipe_memory(model: ModelSpec, system: SystemSpec, t: LayoutTable, pp_rank,
                    reduce_fp32: bool | None = None, phase: str | None = None,
                    grad_sync: bool | None = None, fp8_params: bool | None = None,
                    cp_exchange: str | None = None, held=None,
                    cp_heads: int | None = None) -> dict:
    """:func:`rank_memory` of DualPipe's pipeline rank ``pp_rank`` (DeepSeek-V3 report
    §3.2.1; ``--moe-overlap dualpipe``), which holds two stages of the engine's split, ``h``
    and ``P−1−h`` (moe.dualpipe_stages; the end ranks: the first stage's embedding and the
    last's head and MTP modules): the states of both stages' blocks and parts, their sum
    (DualPipe's README@89f5de17 table: Parameter "2×"; DeepSeek-V3's report says of the two
    copies "this does not significantly increase the memory consumption since we use a large
    EP size", but the second stage's experts are held all the same); the activations of ``P − h``
    micro-batches of stage ``h`` and ``h + 1`` of stage ``P−1−h``, ``P + 1`` stage-micro-batches
    (moe.dualpipe_in_flight, the README's "PP+1"), each kept as the layout's recompute keeps a
    block, one block rebuilt at a time and the last stage's logits for its one micro-batch in
    flight; both stages' communication buffers, since DualPipe runs a forward chunk of one
    stage overlapped with a backward chunk of the other. A stage is the rank's layers of the
    split (a layout's interleaving is not DualPipe's: its chunks count as one stage). Where
    both are the same stage (pp 1, or the middle rank of an odd pp, which DualPipe refuses)
    the rank holds it once, as the layout's schedule keeps it. The native engine's FSDP2
    moments take the rank's blocks of both stages with the root of stage ``h``. ``held``: the
    two stages' layers when the caller has them (default: split.rank_layers)."""
    r = np.broadcast_to(np.asarray(pp_rank), (len(t),)).astype(np.int64)
    a, b = moe.dualpipe_stages(t.pp, r)
    two = a != b
    n_a, n_b = moe.dualpipe_in_flight(t.pp, t.num_microbatches, a)
    held_a, held_b = ((rank_layers(model, t, a)[0], rank_layers(model, t, b)[0])
                      if held is None else held)
    # A DualPipe stage is the rank's whole share of the split, one chunk of ``held`` blocks.
    pa = activation_parts(model, t, a, held_a, cp_exchange, in_flight=n_a, cp_heads=cp_heads)
    pb = activation_parts(model, t, b, held_b, cp_exchange, in_flight=n_b, cp_heads=cp_heads)
    sa = state_bytes(model, t, a, held_a, reduce_fp32, fp8_params)
    sb = state_bytes(model, t, b, held_b, reduce_fp32, fp8_params)
    states = {k: sa[k] + sb[k] for k in sa}
    masks = cp_mask_bytes(model, t, cp_exchange)  # one table per rank, shared by every layer
    parts = {"steady": pa["steady"] + pb["steady"] - masks,
             "head": pa["head"] + pb["head"], "mtp": pa["mtp"] + pb["mtp"],
             "transient": np.maximum(pa["transient"], pb["transient"]),
             "ring": np.maximum(pa["ring"], pb["ring"]), "per_layer": pa["per_layer"]}
    buffers = (buffer_bytes(model, t, a, held_a, reduce_fp32)
               + buffer_bytes(model, t, b, held_b, reduce_fp32))
    # A backward ran before the peak unless it is the first backward of the rank's steady step:
    # DualPipe's step 4 reaches the peak again while micro-batches of stage ``h`` remain.
    earlier = t.num_microbatches // 2 > n_a
    out = _assemble(model, system, t, a, held_a + held_b, states, parts, b == t.pp - 1,
                    buffers, earlier, phase, grad_sync, fp8_params, reduce_fp32)
    if two.all():
        return out
    once = rank_memory(model, system, t, a, reduce_fp32=reduce_fp32, phase=phase,
                       grad_sync=grad_sync, fp8_params=fp8_params, cp_exchange=cp_exchange,
                       cp_heads=cp_heads)
    return {k: np.where(two, out[k], once[k]) for k in out}


def peak_memory(model: ModelSpec, system: SystemSpec, t: LayoutTable,
                reduce_fp32: bool | None = None, grad_sync: bool | None = None,
                fp8_params: bool | None = None, cp_exchange: str | None = None,
                dualpipe: bool = False, cp_heads: int | None = None) -> dict:
    """The rank with the most memory: the first stage (embeddings, most micro-batches in
    flight), the last (head, logits) or, where the engine splits layers unevenly, the middle
    stage holding the most layers (the earliest such, which holds the most micro-batches).
    ``reduce_fp32``: whether gradients are reduced in fp32 (None: the engine's rule);
    ``fp8_params``: FP8 parameters (None: flm's export, costmodel/fp8.py ``fp8_params``).
    ``dualpipe``: the run's pipeline is DeepSeek's DualPipe (``MoeRun.overlap``): the fullest
    of its ranks, each holding two stages (:func:`dualpipe_memory`), for every layout with a
    pipeline; ``stage`` is then the DualPipe rank ``h`` (ranks ``h`` and ``P−1−h`` hold the
    same). ``cp_heads``: the K/V heads SDPA receives (None: the model's kv heads;
    :func:`layer_activation_bytes`, :func:`cp_ring_backward_bytes`)."""
    dual = np.asarray(t.pp) > 1 if dualpipe else np.zeros(len(t), dtype=bool)
    args = (reduce_fp32, grad_sync, fp8_params, cp_exchange, cp_heads)
    if not dual.any():
        return _schedule_peak(model, system, t, *args)
    if dual.all():
        return _dualpipe_peak(model, system, t, *args)
    rows, rest = np.flatnonzero(dual), np.flatnonzero(~dual)
    got = _dualpipe_peak(model, system, t.take(rows), *args)
    other = _schedule_peak(model, system, t.take(rest), *args)
    out = {}
    for k in got:
        col = np.zeros(len(t), dtype=np.result_type(got[k], other[k]))
        col[rows], col[rest] = got[k], other[k]
        out[k] = col
    return out


def _dualpipe_peak(model: ModelSpec, system: SystemSpec, t: LayoutTable,
                   reduce_fp32: bool | None, grad_sync: bool | None,
                   fp8_params: bool | None, cp_exchange: str | None,
                   cp_heads: int | None = None) -> dict:
    """The fullest DualPipe rank (:func:`dualpipe_memory`) of every layout: each pair of
    mirrored ranks evaluated, since an uneven split or DeepSeek-V3's light last stage can make
    a middle pair fuller than the end ranks."""
    out = None
    pairs = (np.asarray(t.pp) + 1) // 2
    table, split_of = _held_table(model, t)
    for h in range(int(pairs.max())):
        rows = np.flatnonzero(pairs > h)
        sub = t if len(rows) == len(t) else t.take(rows)
        a, b = moe.dualpipe_stages(sub.pp, h)
        mem = dualpipe_memory(model, system, sub, h, reduce_fp32, grad_sync=grad_sync,
                              fp8_params=fp8_params, cp_exchange=cp_exchange,
                              held=(table[split_of[rows], a], table[split_of[rows], b]),
                              cp_heads=cp_heads)
        mem["stage"] = np.full(len(sub), h)
        if out is None:
            out = {k: np.array(v, dtype=float) for k, v in mem.items()}
            continue
        win = mem["peak"] > out["peak"][rows]
        for k in out:
            out[k][rows[win]] = np.asarray(mem[k])[win]
    return out


def _held_table(model: ModelSpec, t: LayoutTable) -> tuple[np.ndarray, np.ndarray]:
    """(layers held by each pipeline rank of each distinct split, each row's split): split.
    rank_layers looked up once per distinct (pp, v, engine, first, last) rather than row by
    row, for DualPipe's every rank of a planner's table."""
    cols = [np.asarray(c, dtype=np.int64) for c in (t.pp, t.virtual_stages, t.engine,
                                                    t.first_stage_layers, t.last_stage_layers)]
    key = np.zeros(len(t), dtype=np.int64)
    for c in cols:  # a dense mixed-radix key over the columns' ranges
        key = key * (int(c.max()) + 1) + c
    _, first, split_of = np.unique(key, return_index=True, return_inverse=True)
    reps = t.take(first)
    width = int(t.pp.max())
    table = np.stack([rank_layers(model, reps, np.minimum(r, reps.pp - 1))[0]
                      for r in range(width)], axis=1)
    return table, split_of.reshape(-1)


def _schedule_peak(model: ModelSpec, system: SystemSpec, t: LayoutTable,
                   reduce_fp32: bool | None = None, grad_sync: bool | None = None,
                   fp8_params: bool | None = None, cp_exchange: str | None = None,
                   cp_heads: int | None = None) -> dict:
    """:func:`peak_memory` under the layout's own schedule (GPipe, 1F1B, interleaved)."""
    ranks = pipeline_ranks(model, t)
    out = None
    for r, held, chunk in ((np.zeros(len(t), dtype=np.int64), ranks["first"],
                            ranks["chunk_first"]),
                           (t.pp - 1, ranks["last"], ranks["chunk_last"])):
        mem = rank_memory(model, system, t, r, held, chunk, reduce_fp32,
                          grad_sync=grad_sync, fp8_params=fp8_params,
                          cp_exchange=cp_exchange, cp_heads=cp_heads)
        mem["stage"] = np.broadcast_to(r, (len(t),))
        if out is None:
            out = mem
            continue
        bigger = mem["peak"] > out["peak"]
        out = {k: np.where(bigger, mem[k], out[k]) for k in out}
    # A middle rank with no more layers than rank 0 holds less than it (fewer micro-batches in
    # flight, no embeddings): only uneven splits can make one the fullest, so only those rows
    # evaluate it.
    rows = np.flatnonzero(ranks["mid_held"] > ranks["first"])
    if len(rows):
        sub = t.take(rows)
        mem = rank_memory(model, system, sub, ranks["mid"][rows], ranks["mid_held"][rows],
                          ranks["chunk_mid"][rows], reduce_fp32, grad_sync=grad_sync,
                          fp8_params=fp8_params, cp_exchange=cp_exchange, cp_heads=cp_heads)
        mem["stage"] = ranks["mid"][rows]
        bigger = rows[mem["peak"] > out["peak"][rows]]
        win = mem["peak"] > out["peak"][rows]
        out = {k: np.array(v, dtype=np.result_type(v, mem[k]), copy=True)
               for k, v in out.items()}
        for k in out:
            out[k][bigger] = np.asarray(mem[k])[win]
    return out


# Scalar helpers for one layout (the benchmark compares its measured bytes with these).
def rank_state_bytes(model: ModelSpec, layout: Layout, pp_rank: int) -> dict[str, int]:
    s = state_bytes(model, from_configs([layout]), pp_rank)
    return {f"{k}_bytes": int(v[0]) for k, v in s.items()}


def rank_activation_bytes(model: ModelSpec, layout: Layout, pp_rank: int,
                          engine: str | None = None) -> int:
    """``engine`` (optional) must agree with the layout's: the engine is a layout field."""
    _check_engine(layout, engine)
    return int(activation_bytes(model, from_configs([layout]), pp_rank)[0])


def _check_engine(layout: Layout, engine: str | None) -> None:
    if engine is not None and Engine.parse(engine, "engine") != layout.engine:
        raise ValueError(f"engine {engine!r} differs from the layout's ({layout.engine}); "
                         "set Layout.engine instead")
