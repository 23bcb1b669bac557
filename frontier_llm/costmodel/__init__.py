"""The analytical cost model: FLOPs, per-rank memory and step time of a training layout.

Pure functions over a :class:`~frontier_llm.costmodel.layouts.LayoutTable` (numpy columns), so the
planner evaluates every candidate layout at once; :func:`predict` is the scalar entry point for one
``Layout`` and runs the same code on a table of one row. Formulas, citations and what is
not modelled: docs/costmodel.md.
"""

from __future__ import annotations

import numpy as np

from frontier_llm.costmodel.dualpipe_rules import check_dualpipe
from frontier_llm.costmodel.flops import hardware_flops, model_flops
from frontier_llm.costmodel.fp8 import check_fp8, compute_dtype
from frontier_llm.costmodel.layouts import LayoutTable, dtype_peaks, from_configs
from frontier_llm.costmodel.memory import _check_engine, peak_memory
from frontier_llm.costmodel.moe import NO_OVERLAP, MoeRun
from frontier_llm.costmodel.p2p_overlap import p2p_overlap_refusal
from frontier_llm.costmodel.steptime import step_time
from frontier_llm.costmodel.tp_overlap import tp_overlap_refusal
from frontier_llm.errors import UserError
from frontier_llm.specs.layout import Layout, Recompute
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import SystemSpec

# Bump when a formula or a default changes what the model predicts; stored beside every
# prediction so that old predictions are never compared with new ones unknowingly.
# 2.1: context parallelism (cp > 1 priced; cp 1 unchanged). 2.2: DeepSpeed's ZeRO-0/1/2
# reductions as the engine issues them (specs/engine_rules.py); no other engine moves. 2.3: the
# native engine's memory as flm memcheck measures it (costmodel/memory.py rank_memory). 2.4:
# multi-token-prediction modules priced on the last stage, an MoE stage's parameters from its
# own blocks (dense first blocks on the first stage), given end stages (first/last_stage_layers);
# models without MTP or dense blocks and layouts without given ends are unchanged.
# 2.5: DeepSpeed's pipeline exchanges as its PipelineEngine issues them
# (steptime.deepspeed_pipe_p2p): four blocking messages a micro-batch and the TP all-gathers of
# its partitioned tensors. 2.6: the reserve as context, collective buffers and allocator
# fragmentation (costmodel/reserve.py) instead of a fixed 5 GB; FSDP2's gradient sync per
# micro-batch as each trainer runs it (grad_sync). 2.7: an MoE rank's load imbalance by what
# the router's balance holds even (moe.load_imbalance: a micro-batch balance loss at its
# sampling-noise floor, router_balance aux-loss-global for a global-batch loss) and DualPipe's
# mirrored stages and bubble (moe.dualpipe_pace); the native engine's context-parallel
# exchange as each trainer runs it (cp_exchange): flm bench's single gather, or PyTorch's
# context_parallel ring (torchtitan), priced in time and memory; an interleaved Megatron
# schedule's pipeline sends overlapped where a run states it (p2p_overlap); FSDP2's
# block-backward memory moment; DualPipe's two stages and PP+1 in-flight micro-batches per
# rank (memory.py); Jean Zay's Omni-Path without rails. 2.8: DeepSpeed's BF16_Optimizer where
# DeepSpeed picks it on its own (behaviour.bf16_optimizer: bf16, pp > 1, no ZeRO): fp32
# gradient accumulation each micro-batch and fp32 reduction; Megatron's --tp-comm-overlap
# priced only beside sequence parallelism, as Megatron-LM runs it (costmodel/tp_overlap.py);
# other layouts unchanged. 2.9: PyTorch's context_parallel ring compiled (eager False) waits
# for each K/V gather and dK/dV send at once (traced functional collectives), nothing overlapped
# (steptime.cp_exchange_times); the eager ring and other layouts unchanged. Megatron-LM's fused
# attention at its kernel's published measured rate where one exists (attention_kernels.py:
# cuDNN on Hopper, CK/AITER v3 on the MI355X). BF16_Optimizer as DeepSpeed 0.19.8 runs it
# unless a run states otherwise: a bf16 accumulator and reduction (the fp32 of 2.8 stays for
# runs that state it), Adam on the 1/dp partition, the bf16 all-gather after the step, and its
# memory (memory.bf16_optimizer_states). 2.10: the same kernel rule on CDNA3 (MI300X, MI325X:
# AITER's measured v3 rates, fp32-atomic backward); the CDNA3 systems' matmul knobs from AMD's
# measured MAF table (catalog data, not this module). 2.11: FSDP2 under a pipeline accumulates
# unsharded gradients until the stage's last micro-batch whatever the trainer's loop (torch's
# PipelineStage turns gradient sync off), held in fp32 where the run states an fp32-reducing
# policy (torchtitan); memory only, layouts priced by default unchanged.
COSTMODEL_VERSION = "2.11"

TIME_PARTS = ("compute", "elementwise", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm",
              "pp_bubble", "head", "dp_comm", "optimizer")
MEMORY_PARTS = ("params", "grads", "optimizer", "activations", "loss", "buffers", "step",
                "reserved")
# The reserve's terms (costmodel/reserve.py), which sum to ``reserved``.
RESERVE_PARTS = ("context", "collective", "fragmentation")


def evaluate(model: ModelSpec, system: SystemSpec, table: LayoutTable,
             eager: bool = False, overlap_comm: bool = True,
             reduce_fp32: bool | None = None,
             tp_comm_overlap: bool = False,
             moe_run: MoeRun = NO_OVERLAP, grad_sync: bool | None = None,
             fp8_params: bool | None = None,
             p2p_overlap: bool = False, cp_exchange: str | None = None,
             cp_heads: int | None = None) -> dict[str, np.ndarray]:
    """Every figure of the model for every layout in ``table`` (numpy columns). Each layout's
    engine (its ``engine`` column) decides how its work is scheduled and what it keeps
    (specs/engine_rules.py). ``eager``: un-compiled PyTorch element-wise kernels
    (:func:`~frontier_llm.costmodel.steptime.block_times`); ``overlap_comm`` False: DeepSpeed's
    ZeRO-1/2 reductions not overlapped (:func:`~frontier_llm.costmodel.steptime.
    data_parallel_times`); ``reduce_fp32``: gradients reduced in fp32 or not (None: each
    engine's rule; False: an FSDP policy whose ``reduce_dtype`` is the training dtype);
    ``tp_comm_overlap``: the run turns on its engine's TP overlap (Megatron-LM's
    ``--tp-comm-overlap``; :func:`~frontier_llm.costmodel.steptime.block_times`); ``moe_run``:
    how an MoE run dispatches and overlaps its all-to-alls (:class:`~frontier_llm.costmodel.moe.
    MoeRun`); ``grad_sync``: sharded gradients reduce-scattered after every micro-batch
    (torchtitan) or only after the last (flm bench); None: the engine's rule
    (specs/engine_rules.py ``GRAD_SYNC_EACH``), priced in time and memory alike;
    ``fp8_params``: Megatron FP8 weights held as FP8 parameters (None: where flm's export
    writes ``--fp8-param-gather``; costmodel/fp8.py ``fp8_params``); ``p2p_overlap``: an
    interleaved Megatron schedule's pipeline sends overlapped with compute (Megatron-Core's
    ``overlap_p2p_comm``; :func:`~frontier_llm.costmodel.steptime.stage_times`);
    ``cp_exchange``: the native engine's context-parallel exchange, "gather" (flm bench's one
    K/V all-gather and masked attention) or "ring" (PyTorch's ``context_parallel``, as
    torchtitan runs it); None: the engine's rule (specs/engine_rules.py ``CP_EXCHANGE``),
    priced in time and memory alike. ``cp_heads``: the K/V heads SDPA receives, which a fused
    kernel saves and that ring exchanges and holds (None: the model's kv heads, as torchtitan
    v0.2.2, which flm renders, runs it; a number: a run whose model code repeats K/V to that
    many heads before SDPA, torchtitan before ff0829c;
    :func:`~frontier_llm.costmodel.steptime.kv_exchange_bytes`,
    :func:`~frontier_llm.costmodel.memory.layer_activation_bytes`)."""
    times = step_time(model, system, table, eager, overlap_comm, reduce_fp32, tp_comm_overlap,
                      moe_run, grad_sync, p2p_overlap, cp_exchange, cp_heads)
    mem = peak_memory(model, system, table, reduce_fp32, grad_sync, fp8_params, cp_exchange,
                      dualpipe=moe_run.overlap == "dualpipe", cp_heads=cp_heads)
    tokens = table.global_batch * model.seq_len
    gpus = table.world_size
    # MFU and HFU of an fp8 layout are counted against the bf16 peak, as its sources count them
    # (torchtitan's and Megatron-LM's logs; costmodel/fp8.py).
    peak = dtype_peaks(system)[compute_dtype(table)]
    hw = np.array([[hardware_flops(model, 1.0, r, flash) for flash in (False, True)]
                   for r in Recompute.words()])
    model_f = model_flops(model, tokens.astype(float))
    hardware_f = hw[table.recompute, table.flash_attention.astype(int)] * tokens
    step = times["step_time"]
    out = {
        "step_time_s": step,
        "tokens_per_s": tokens / step,
        "model_tflops_per_gpu": model_f / step / gpus / 1e12,
        "hardware_tflops_per_gpu": hardware_f / step / gpus / 1e12,
        "mfu": model_f / step / gpus / peak,
        "hfu": hardware_f / step / gpus / peak,
        "peak_memory_bytes": mem["peak"],
        "peak_memory_stage": mem["stage"],
        "fits": mem["peak"] <= system.memory_bytes,
    }
    out.update({f"time_{k}_s": times[k] for k in TIME_PARTS})
    out.update({f"mem_{k}_bytes": mem[k] for k in MEMORY_PARTS + RESERVE_PARTS})
    out["mem_fp8_bytes"] = mem["fp8"]  # FP8 weight copies (costmodel/fp8.py), 0 otherwise
    return out


def predict(model: ModelSpec, system: SystemSpec, layout: Layout,
            engine: str | None = None, moe_run: MoeRun = NO_OVERLAP,
            grad_sync: bool | None = None, cp_exchange: str | None = None,
            p2p_overlap: bool = False, tp_comm_overlap: bool = False) -> dict:
    """One layout's prediction as a JSON-able dict (what a trace's ``prediction`` holds).
    ``engine`` (optional, for callers that name it) must agree with ``layout.engine``;
    ``moe_run``, ``grad_sync``, ``cp_exchange``, ``p2p_overlap``, ``tp_comm_overlap``:
    :func:`evaluate`'s. ``p2p_overlap`` on a layout it cannot change (not Megatron's
    interleaved schedule) is refused (costmodel/p2p_overlap.py), not silently priced as off;
    so is ``tp_comm_overlap`` where Megatron-LM would not run it (not Megatron with sequence
    parallelism: costmodel/tp_overlap.py)."""
    _check_engine(layout, engine)
    layout.check_model(model)
    check_fp8(system, layout.dtype, layout.fp8_recipe, layout.engine)
    if p2p_overlap and (why := p2p_overlap_refusal(layout)):
        raise UserError(why)
    if tp_comm_overlap and (why := tp_overlap_refusal(layout)):
        raise UserError(why)
    if moe_run.overlap == "dualpipe":  # the planner's DualPipe rules (planner/space.py)
        check_dualpipe(layout.pp, layout.schedule, layout.engine)
    row = {k: v[0].item()
           for k, v in evaluate(model, system, from_configs([layout]), moe_run=moe_run,
                                grad_sync=grad_sync, p2p_overlap=p2p_overlap,
                                cp_exchange=cp_exchange,
                                tp_comm_overlap=tp_comm_overlap).items()}
    return {
        "costmodel_version": COSTMODEL_VERSION,
        "step_time_s": row["step_time_s"],
        "tokens_per_s": row["tokens_per_s"],
        "model_tflops_per_gpu": row["model_tflops_per_gpu"],
        "hardware_tflops_per_gpu": row["hardware_tflops_per_gpu"],
        "mfu": row["mfu"],
        "hfu": row["hfu"],
        "peak_memory_bytes": row["peak_memory_bytes"],
        "fits": bool(row["fits"]),
        "breakdown": {
            "time_s": {k: row[f"time_{k}_s"] for k in TIME_PARTS},
            "memory_bytes": {k: row[f"mem_{k}_bytes"] for k in MEMORY_PARTS},
            "reserve_bytes": {k: row[f"mem_{k}_bytes"] for k in RESERVE_PARTS},
            "peak_memory_stage": int(row["peak_memory_stage"]),
        },
    }


__all__ = ["COSTMODEL_VERSION", "LayoutTable", "evaluate", "from_configs", "predict"]
