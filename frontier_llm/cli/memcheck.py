"""``flm memcheck``: one rank's training step measured at full size, beside the cost model."""

from __future__ import annotations

import argparse

from frontier_llm.cli.common import add_command, add_format, emit_json
from frontier_llm.cli.layout_args import add_layout_args, layout_from_args
from frontier_llm.cli.plan import _add_seq_len, _at_length, model_from_args

# The measured terms each cost-model term is compared with (bench/memcheck.py).
PAIRS = (("params", "params"), ("grads", "grads"), ("optimizer", "optimizer"),
         ("activations", "activations"), ("loss", "temporaries"), ("buffers", "buffers"),
         ("step", "temporaries"))


def predicted_terms(model, system, layout, pp_rank: int,
                    grad_sync: bool | None = None) -> dict[str, float]:
    """The cost model's terms for stage ``pp_rank`` of ``layout`` (costmodel/memory.py);
    ``grad_sync``: the FSDP2 accumulation setting (None: the engine's rule). Context
    parallelism is flm bench's own, the one memcheck runs (its single K/V gather and masks:
    specs/engine_rules.py ``CP_EXCHANGE``)."""
    from frontier_llm.costmodel.layouts import from_configs
    from frontier_llm.costmodel.memory import rank_memory
    from frontier_llm.specs.engine_rules import CP_EXCHANGE

    mem = rank_memory(model, system, from_configs([layout]), pp_rank, grad_sync=grad_sync,
                      cp_exchange=CP_EXCHANGE["flm-bench"])
    return {k: float(v[0]) for k, v in mem.items()}


def run_memcheck(args: argparse.Namespace) -> int:
    from frontier_llm.bench.memcheck import measure
    from frontier_llm.catalog import load_system

    model, system = model_from_args(args), load_system(args.system)
    layout = layout_from_args(args)
    sync = args.grad_sync_each_microbatch
    got = measure(model, layout, rank=args.rank, device=args.device,
                  grad_sync_each_microbatch=sync)
    pred = predicted_terms(model, system, layout, got.pp_rank, grad_sync=sync)
    predicted_peak = pred["peak"] - pred["reserved"]
    out = {
        "model": model.name, "system": system.name, "layout": layout.to_dict(),
        "rank": got.rank, "pipeline_stage": got.pp_rank, "device": got.device,
        "measured_peak_bytes": got.peak_bytes,
        "measured_reserved_bytes": got.reserved_bytes,
        "measured_phase": got.phase if got.backward else None,
        "measured_breakdown": {"backward": got.backward, "step": got.step},
        "predicted_peak_bytes": predicted_peak,
        "predicted_reserve_bytes": pred["reserved"],
        "predicted_breakdown": {k: v for k, v in pred.items() if k not in ("peak",)},
        "not_traced": NOT_TRACED,
        "notes": got.notes,
    }
    if args.format == "json":
        emit_json(out)
        return 0
    g = 2**30
    print(f"{model.name}{_at_length(args, model)}, rank {got.rank} (pipeline stage "
          f"{got.pp_rank}) of {layout.world_size}, {got.device}")
    ratio = predicted_peak / got.peak_bytes - 1 if got.peak_bytes else float("nan")
    print(f"peak        measured {got.peak_bytes / g:.2f} GiB, predicted "
          f"{predicted_peak / g:.2f} GiB ({ratio:+.1%}); the reserve adds "
          f"{pred['reserved'] / g:.2f} GiB")
    if got.reserved_bytes is not None:
        print(f"reserved    {got.reserved_bytes / g:.2f} GiB (torch.cuda.max_memory_reserved)")
    if got.backward:
        print(f"peak falls  in the {got.phase} (measured); the cost model's: "
              f"{'step' if pred['step'] > 0 else 'backward'}")
        print(f"{'term':<12}{'predicted':>10}{'backward':>10}{'step':>10}   GiB")
        for term, measured in PAIRS:
            b = got.backward.get(measured, 0) if term != "step" else 0
            s = got.step.get(measured, 0) if term in ("params", "grads", "optimizer",
                                                      "step") else 0
            print(f"{term:<12}{pred[term] / g:>10.2f}{b / g:>10.2f}{s / g:>10.2f}")
    for note in got.notes:
        print(f"note        {note}")
    print(f"not traced  {NOT_TRACED}")
    return 0


NOT_TRACED = ("the CUDA/HIP context, NCCL/RCCL's own buffers and the allocator's rounding and "
              "fragmentation (the reserve); DeepSpeed's and Megatron-LM's engines (refused: "
              "their steps are not flm bench's); the MoE router's auxiliary loss (a scalar) "
              "and uneven expert loads (every expert gets the mean)")


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "memcheck", "measure one rank's memory at full size, without a GPU",
        "Run one training step of flm bench's own model for ONE rank of the layout (its tp, "
        "cp, pipeline-stage and FSDP2 shards, recompute, micro-batch and loss) at the real "
        "model's shapes under PyTorch's fake tensors and a fake process group of the full "
        "world size, and record the allocator-level peak with PyTorch's MemTracker / "
        "FSDPMemTracker: no memory is allocated for the model. Prints the peak and its "
        "breakdown (forward+backward and optimizer step) beside the cost model's terms. "
        "The native engine only (DeepSpeed's and Megatron-LM's steps cannot be traced here). "
        "--device cuda runs the same step on a GPU and reads torch.cuda.max_memory_allocated "
        "and max_memory_reserved.",
        ["flm memcheck --model llama3-8b --system dgx-h100 --tp 2 --dp 4 --global-batch 8 "
         "--sharding zero3",
         "flm memcheck --model llama3-70b --system dgx-h100 --tp 8 --pp 4 --global-batch 8 "
         "--format json"],
    )
    p.add_argument("--model", required=True, help="catalog name or YAML path")
    p.add_argument("--system", required=True,
                   help="catalog name or YAML path (the cost model's reserve and capacity)")
    _add_seq_len(p)
    p.add_argument("--rank", type=int, default=None,
                   help="the global rank to measure (default: the first rank of the pipeline "
                        "stage the cost model predicts fullest)")
    p.add_argument("--device", choices=("fake", "cuda"), default="fake",
                   help="fake: fake tensors on CPU, no memory (default); cuda: one GPU")
    p.add_argument("--grad-sync-each-microbatch", action="store_true",
                   help="FSDP2 reduce-scatters after every micro-batch (torchtitan's "
                        "accumulation) instead of only after the last (flm bench's default)")
    add_layout_args(p)
    add_format(p, choices=("table", "json"))
    p.set_defaults(func=run_memcheck)
