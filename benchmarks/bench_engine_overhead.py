"""Engine overhead: the native engine's step against a plain PyTorch training loop.

The same model (``--model``, default small-gpt), tp = pp = dp = 1, the same batch shape and
dtype, in the same process and run. The engine's step is timed exactly as ``flm bench`` times
it (barrier, ``NativeEngine.step``, barrier); the baseline is the loop anyone would write:
``model(x)``, cross entropy, ``backward()``, ``torch.optim.Adam(foreach=True).step()``,
``zero_grad()`` on a batch prepared in advance. Blocks of steps alternate between the two so
that drift of the machine hits both alike. Prints both medians and their ratio; target
(issue 3): engine / plain <= 1.10.

With a GPU (``torch.cuda.is_available()``) it also trains a GPT of about 1.3B parameters
(catalog gpt3-1.3b: 24 layers, hidden 2048, seq 2048; bf16, flash attention) on one GPU
through the engine and prints its MFU against the system's bf16 peak (target >= 0.50 on H100).

    python benchmarks/bench_engine_overhead.py [--model small-gpt] [--steps 30] [--blocks 3]
        [--micro-batch 8] [--dtype fp32] [--gpu-micro-batch 4] [--gpu-steps 10]
    python benchmarks/bench_engine_overhead.py --quick   # seconds: what the tests run

``--quick``: tiny-gpt, micro-batch 2, one block of 5 steps each (one GPU step with a GPU); the
same code and figures, too few steps for the ratio to mean much.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
import torch.distributed as dist

from frontier_llm.bench.engine import LR, NativeEngine
from frontier_llm.bench.launch import free_port
from frontier_llm.bench.model import build_model, loss_fn
from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel.flops import model_flops
from frontier_llm.specs.layout import Layout


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_engine(engine: NativeEngine, steps: int, start: int, device: torch.device
                ) -> list[float]:
    out = []
    for i in range(steps):
        _sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        engine.step(start + i)
        _sync(device)
        dist.barrier()
        out.append(time.perf_counter() - t0)
    return out


def time_plain(model, opt, x, y, steps: int, device: torch.device, dtype: torch.dtype
               ) -> list[float]:
    out = []
    for _ in range(steps):
        _sync(device)
        t0 = time.perf_counter()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        out.append(time.perf_counter() - t0)
    return out


def overhead(args: argparse.Namespace, device: torch.device) -> None:
    spec = load_model(args.model)
    layout = Layout(micro_batch=args.micro_batch, global_batch=args.micro_batch,
                            dtype=args.dtype)
    engine = NativeEngine(spec, layout, rank=0, world_size=1, device=device, seed=0)
    model = build_model(spec, seed=0, dtype=args.dtype, device=device)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=LR, betas=(0.9, 0.95), foreach=True)
    x, y = engine.data.rank_batch(0, layout.global_batch, 1, 0)
    x, y = x.to(device), y.to(device)
    # Warm up both (allocator, kernels, the engine's one-time saved-activation measurement).
    engine.step(0, measure_activations=True)
    time_engine(engine, 2, 1, device)
    time_plain(model, opt, x, y, 3, device, None)
    eng, plain = [], []
    for b in range(args.blocks):
        eng += time_engine(engine, args.steps, 10 + b * args.steps, device)
        plain += time_plain(model, opt, x, y, args.steps, device, None)
    e, p = statistics.median(eng), statistics.median(plain)
    tokens = layout.global_batch * spec.seq_len
    print(f"model {spec.name} ({spec.num_params() / 1e6:.2f}M params), {args.dtype}, "
          f"micro-batch {args.micro_batch}, seq {spec.seq_len}, device {device}, "
          f"threads {torch.get_num_threads()}")
    print(f"plain PyTorch loop: median {p * 1e3:.2f} ms/step over {len(plain)} steps "
          f"({tokens / p:,.0f} tokens/s)")
    print(f"native engine:      median {e * 1e3:.2f} ms/step over {len(eng)} steps "
          f"({tokens / e:,.0f} tokens/s)")
    print(f"ratio engine / plain = {e / p:.3f}  (target <= 1.10)")


def gpu_mfu(args: argparse.Namespace, device: torch.device) -> None:
    spec = load_model("gpt3-1.3b")
    name = torch.cuda.get_device_name(device)
    system = load_system("dgx-h100" if "H100" in name or "H200" in name else "dgx-a100")
    layout = Layout(micro_batch=args.gpu_micro_batch,
                            global_batch=args.gpu_micro_batch, dtype="bf16",
                            flash_attention=True)
    engine = NativeEngine(spec, layout, rank=0, world_size=1, device=device, seed=0)
    times = time_engine(engine, args.gpu_steps + 3, 0, device)[3:]
    t = statistics.median(times)
    tokens = layout.global_batch * spec.seq_len
    flops = model_flops(spec, tokens) / t
    peak = system.peak_flops["bf16"]
    print(f"GPU {name}: {spec.name} ({spec.num_params() / 1e9:.2f}B params), bf16, "
          f"micro-batch {layout.micro_batch}, seq {spec.seq_len}: median {t * 1e3:.1f} ms/step, "
          f"{tokens / t:,.0f} tokens/s, {flops / 1e12:.1f} TFLOP/s, MFU {flops / peak:.3f} "
          f"(peak {peak / 1e12:.0f} TFLOP/s from {system.name}; target >= 0.50), "
          f"allocated peak {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="small-gpt")
    ap.add_argument("--steps", type=int, default=30, help="steps per block and contender")
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--gpu-micro-batch", type=int, default=4)
    ap.add_argument("--gpu-steps", type=int, default=10)
    ap.add_argument("--quick", action="store_true",
                    help="tiny-gpt, micro-batch 2, 1 block of 5 steps (seconds): what "
                         "tests/test_benchmarks.py runs")
    args = ap.parse_args()
    if args.quick:
        args.model, args.micro_batch, args.steps, args.blocks = "tiny-gpt", 2, 5, 1
        args.gpu_steps = 1
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo",
                            init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        overhead(args, device)
        if cuda:
            gpu_mfu(args, device)
        else:
            print("no GPU: the 1.3B GPT MFU run needs torch.cuda.is_available()")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
