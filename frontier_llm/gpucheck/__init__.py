"""GPU truth: one bounded check of flm on a real GPU, prepared to run on a node with no network.

``scripts/gpu-check.sh OUTDIR`` runs the steps below one by one (each with its own time limit,
all inside one budget of at most eight minutes) as ``python -m frontier_llm.gpucheck STEP``;
a step that fails or runs out of time is recorded and the next one runs. Steps, each a function
of :mod:`.steps` writing its results as JSON into a work folder as it goes:

- ``preflight`` — device, driver, torch/CUDA versions; every requirement of the package importable;
- ``mfu`` — ``flm bench`` native, one GPU, bf16, flash attention, a short list of micro-batches
  (those the cost model says fit): MFU and HFU against the catalog system's dense bf16 peak;
- ``memory`` — none / selective / selective-op / full recompute at two micro-batches: the
  allocator's peaks (allocated, reserved) against ``flm predict``'s peak and its breakdown;
- ``calibrate`` — ``flm calibrate``'s microbenchmark (the model's block GEMMs in bf16) on the
  GPU, its matrix-rate fit and the fitted system file;
- ``deepspeed`` — the DeepSpeed engine at ZeRO 0, 1 and 3 with a world of one;
- ``summarize`` — ``summary.json`` and ``summary.md`` (every figure, every failure with its first
  error line, the step-time error of the built-in and the fitted system on every run), the traces
  in one archive, the calibration and the fitted system file: at most 8 files in OUTDIR.

``--tiny`` runs the same code on this CPU (tiny-gpt, fp32, two steps per run, shorter lists), which
is what the test suite does so that the check cannot rot between GPU runs (tests/test_gpu_check.py).
Wheels for the packages a stock PyTorch image lacks: :mod:`.wheels`, ``scripts/gpu-wheels.sh``.
Documentation: docs/gpu.md.
"""
