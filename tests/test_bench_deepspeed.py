"""flm bench --engine deepspeed trains exactly like one process: real DeepSpeed on real gloo ranks.

The layouts of the issue (ZeRO 0-3 on dp2, pp2 + ZeRO-1, untied and tied, on 2 ranks; tp2 x dp2
ZeRO-1 and ZeRO-3 through AutoTP and pp2 x tp2 through PipelineModule with the engine's own
tensor-parallel layers on 4; dp2 x pp2 x tp2 on 8) train in one launch per world size
(tests/deepspeed_ranks.py: the real DeepSpeedEngine, deepspeed.initialize, PipelineModule);
fp32, fixed seed, 5 steps, losses within 1e-5 relative of the single-process reference, and
per-rank model-state bytes within 0.5 % of the cost model's ``rank_state_bytes`` (which models
DeepSpeed's fp32 master partition and AutoTP's whole vocabulary: costmodel/deepspeed_buffers.py).
The engine comparison runs the real ``flm bench`` command on both engines for one layout.

DeepSpeed JIT-compiles its shared-memory comm op on CPU (about 30 s once): the extension cache
is one stable directory for the whole test run and later ones (``ds_extension_cache``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ds_cache import extension_dir

from frontier_llm.bench.engine import reference_losses
from frontier_llm.bench.launch import free_port
from frontier_llm.bench.trace import read_trace
from frontier_llm.catalog import load_model
from frontier_llm.costmodel.memory import rank_state_bytes
from frontier_llm.specs.engine_rules import rules_for
from frontier_llm.specs.layout import Layout

pytest.importorskip("deepspeed", reason="deepspeed is in the dev extra (DS_BUILD_OPS=0)")

STEPS = 5
REPO = Path(__file__).resolve().parents[1]

# (id, model, layout fields): the correctness layouts the engine runs on 2 ranks.
CASES = [
    ("dp2-zero0", "tiny-gpt", dict(dp=2, global_batch=4, sharding=0)),
    ("dp2-zero1", "tiny-gpt", dict(dp=2, global_batch=4, sharding=1)),
    ("dp2-zero2", "tiny-gpt", dict(dp=2, global_batch=4, sharding=2)),
    ("dp2-zero3", "tiny-llama", dict(dp=2, global_batch=4, sharding=3)),
    ("pp2-zero1", "tiny-gpt", dict(pp=2, global_batch=4, sharding=1)),
    # Tied embeddings: the first stage's embedding and the last stage's head, gradients summed.
    ("pp2-zero1-tied", "tiny-gpt", dict(pp=2, global_batch=4, sharding=1)),
]
# Cases whose last step's collectives are recorded (tests/deepspeed_ranks.py) and checked
# against the cost model's DeepSpeed rules: two micro-batches per step, so a reduction per
# micro-batch and one per step differ.
REDUCTION_CASES = ("dp2-zero0", "dp2-zero1", "dp2-zero2")
# ModelSpec fields a case changes.
MODEL_FIELDS = {"pp2-zero1-tied": {"tied_embeddings": True},
                "pp2xtp2-zero0-tied": {"tied_embeddings": True}}
# On 4 ranks: AutoTP training (explicit layer specs) with ZeRO-1 and ZeRO-3 data parallelism;
# pp2 x tp2 through PipelineModule with the engine's own Megatron-style layers (tp_layers.py),
# GPT (biases, learned positions, tied embeddings: the same vocabulary rows at both ends) with
# ZeRO-0 and Llama (GQA: one KV head per rank) with ZeRO-1.
CASES4 = [
    ("tp2xdp2-zero1", "tiny-gpt", dict(tp=2, dp=2, global_batch=4, sharding=1)),
    ("tp2xdp2-zero3", "tiny-gpt", dict(tp=2, dp=2, global_batch=4, sharding=3)),
    ("pp2xtp2-zero0-tied", "tiny-gpt", dict(pp=2, tp=2, global_batch=4, sharding=0)),
    ("pp2xtp2-zero1", "tiny-llama", dict(pp=2, tp=2, global_batch=4, sharding=1)),
]
# On 8 ranks: all three at once, ZeRO-1 partitioning the optimizer over the two pipelines.
CASES8 = [
    ("dp2xpp2xtp2-zero1", "tiny-gpt", dict(dp=2, pp=2, tp=2, global_batch=4, sharding=1)),
]


@pytest.fixture(scope="session")
def ds_extension_cache() -> dict[str, str]:
    """The environment of every DeepSpeed rank: one extension cache for the whole run (kept
    across runs: tests/ds_cache.py, so the op is built at most once)."""
    return dict(os.environ, TORCH_EXTENSIONS_DIR=extension_dir(), OMP_NUM_THREADS="1",
                PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                         os.environ.get("PYTHONPATH")])))


def launch(tmp_path: Path, env: dict, world: int, cases: list[dict], timeout: float = 400
           ) -> list[list[dict]]:
    """Start ``world`` ranks of tests/deepspeed_ranks.py; every rank's results."""
    port = str(free_port())
    procs = [subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "deepspeed_ranks.py"), str(tmp_path),
         json.dumps(cases)],
        env=dict(env, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = [p.returncode for p in procs]
    assert codes == [0] * world, (codes, outputs[0][-4000:])
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.slow
@pytest.mark.parametrize("world, layouts", [(2, CASES), (4, CASES4), (8, CASES8)],
                         ids=["2-ranks", "4-ranks", "8-ranks"])
def test_layouts_train_like_one_process(tmp_path, ds_extension_cache, world, layouts):
    cases = [{"id": i, "model": m, "layout": f, "steps": STEPS,
              "model_fields": MODEL_FIELDS.get(i, {}), "collectives": i in REDUCTION_CASES}
             for i, m, f in layouts]
    ranks = launch(tmp_path, ds_extension_cache, world, cases)
    for n, (case_id, model_name, fields) in enumerate(layouts):
        model = dataclasses.replace(load_model(model_name), **MODEL_FIELDS.get(case_id, {}))
        layout = Layout(dtype="fp32", engine="deepspeed", **fields)
        ref = reference_losses(model, layout, STEPS)
        # Each data-parallel replica's loss is its own slice's: their mean is the batch's.
        last = [r[n]["losses"] for r in ranks if r[n]["has_last"] and r[n]["coords"]["tp"] == 0]
        assert len(last) == layout.dp
        for step, want in enumerate(ref):
            loss = sum(losses[step] for losses in last) / len(last)
            assert abs(loss - want) <= 1e-5 * abs(want), (case_id, step, last, ref)
        if layout.pp > 1:
            # The split PipelineModule made is the one the cost model assumes.
            from frontier_llm.specs.pipeline_split import stage_layers

            per_stage = stage_layers(model.layers, layout.pp, 1, "deepspeed", model)
            bounds = [0, *(1 + sum(per_stage[:i + 1]) for i in range(layout.pp - 1)),
                      model.layers + 2]
            assert all(r[n]["parts"] == bounds for r in ranks), (ranks[0][n]["parts"], bounds)
        if case_id in REDUCTION_CASES:
            for rank in ranks:
                assert_reduction_as_ruled(layout, rank[n])
        for rank in ranks:
            got = rank[n]
            assert got["id"] == case_id
            want = rank_state_bytes(model, layout, got["coords"]["pp"])
            for key in ("params_bytes", "grads_bytes", "optimizer_bytes"):
                assert got[key] == pytest.approx(want[key], rel=0.005), (case_id, key, got,
                                                                          want)


def assert_reduction_as_ruled(layout: Layout, got: dict) -> None:
    """What the real DeepSpeed issued in one step, phase by phase, is what the cost model's
    DeepSpeed rules price (specs/engine_rules.py, costmodel/steptime.py data_parallel_times):
    the gradient reduction in the last micro-batch's backward only, or in every micro-batch's
    for sharded gradients (``sharded_grad_each_microbatch``); by an all-reduce of the whole
    gradient (``sharded_grad_all_reduce``) or a reduce-scatter; the updated parameters gathered
    inside the optimizer step where the optimizer is sharded (``param_gather_overlap`` off)."""
    rules = rules_for("deepspeed")
    events, params = got["collectives"], got["param_elements"]
    m = layout.num_microbatches
    assert m >= 2, "a per-step and a per-micro-batch reduction must differ"
    sharded = layout.sharding.optim.degree(layout.dp) > 1
    grads_sharded = layout.sharding.grads.degree(layout.dp) > 1
    op = "all_reduce" if rules.sharded_grad_all_reduce or not sharded else "reduce_scatter_tensor"
    every = grads_sharded and rules.sharded_grad_each_microbatch
    for k in range(m):
        moved = events.get(f"backward{k}", {}).get(op, 0)
        if every or k == m - 1:
            # The whole gradient, bucket by bucket (DeepSpeed pads partitions a little).
            assert params <= moved <= 1.05 * params, (layout.sharding, k, events, params)
        else:
            assert moved == 0, (layout.sharding, k, events)
    gathered = events.get(f"step{m - 1}", {}).get("all_gather_into_tensor", 0)
    if sharded and not rules.param_gather_overlap:
        assert params <= gathered <= 1.05 * params, (layout.sharding, events, params)
    else:
        assert gathered == 0, (layout.sharding, events)


def _bench(tmp_path: Path, env: dict, engine: str, *flags: str) -> dict:
    cmd = [sys.executable, "-m", "frontier_llm.cli", "bench", "--model", "tiny-gpt",
           "--engine", engine, "--dtype", "fp32", "--steps", str(STEPS), "--warmup", "1",
           "--trace-dir", str(tmp_path), "--run-id", engine, *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # One JSON line on stdout (DeepSpeed's own prints go to stderr).
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["status"] == "completed"
    return read_trace(tmp_path / f"{engine}.trace.json")


@pytest.mark.slow
def test_one_layout_on_both_engines_gives_equal_losses(tmp_path, ds_extension_cache):
    """pp2 x ZeRO-1 through the real flm bench command (its local launcher, run.py's timing,
    trace and memory gathering) on the native and the DeepSpeed engine."""
    flags = ("--pp", "2", "--zero", "1", "--global-batch", "4")
    native = _bench(tmp_path, ds_extension_cache, "native", *flags)
    ds = _bench(tmp_path, ds_extension_cache, "deepspeed", *flags)
    assert (native["engine"], ds["engine"]) == ("native", "deepspeed")
    assert ds["layout"]["engine"] == "deepspeed" and ds["layout_hash"] != native["layout_hash"]
    a = [s["loss"] for s in native["steps"]]
    b = [s["loss"] for s in ds["steps"]]
    assert len(a) == len(b) == STEPS + 1
    for x, y in zip(a, b, strict=True):
        assert abs(x - y) <= 1e-5 * abs(x), (a, b)
    # Both traces carry the cost model's per-rank state, matched by what each engine holds.
    for trace in (native, ds):
        pred = {m["pp_stage"]: m for m in trace["prediction"]["memory_per_rank"]}
        for m in trace["memory"]:
            for key in ("params_bytes", "grads_bytes", "optimizer_bytes"):
                assert m[key] == pytest.approx(pred[m["pp_stage"]][key], rel=0.005), (
                    trace["engine"], m, pred)
    assert ds["summary"]["steps_measured"] == STEPS


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["mpiexec", "deepspeed"])
def test_deepspeed_engine_under_mpiexec_and_the_deepspeed_launcher(tmp_path, ds_extension_cache,
                                                                   launcher):
    """mpiexec (MPICH; rank 0's address broadcast with mpi4py, LOCAL_RANK from MPI) and the
    deepspeed launcher (``--no_local_rank``: flm takes no --local_rank argument) run dp2 ZeRO-2."""
    bench = ["-m", "frontier_llm.cli", "bench", "--model", "tiny-gpt", "--engine", "deepspeed",
             "--dp", "2", "--zero", "2", "--global-batch", "4", "--dtype", "fp32", "--steps",
             "2", "--warmup", "0", "--trace-dir", str(tmp_path), "--run-id", launcher]
    if launcher == "mpiexec":
        cmd = ["mpiexec", "-n", "2", sys.executable, *bench]
    else:
        cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2",
               "--no_local_rank", "--master_port", str(free_port()), "--module", *bench[1:]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=ds_extension_cache)
    assert proc.returncode == 0, proc.stderr[-4000:]
    trace = read_trace(tmp_path / f"{launcher}.trace.json")
    assert trace["status"] == "completed", trace["error"]
    assert trace["environment"]["launcher"] == launcher
    assert trace["environment"]["world_size"] == 2
    ref = reference_losses(load_model("tiny-gpt"), Layout(global_batch=4, dtype="fp32"), 2)
    for got, want in zip([s["loss"] for s in trace["steps"]], ref, strict=True):
        assert abs(got - want) <= 1e-5 * want


# DeepSpeed's BF16_Optimizer on 4 ranks (dp2 x pp2 and dp1 x pp4, bf16): chosen by DeepSpeed
# itself at ZeRO stage 0 with flm's config (no grad_accum_dtype: a bf16 accumulator), and at
# ZeRO-1 with a config stating ``data_types.grad_accum_dtype`` fp32 (an fp32 accumulator),
# which the cost model sees as a stated fp32 reduction (``reduce_fp32`` True).
BF16_OPT_CASES = [
    ("dp2xpp2-zero0-bf16", dict(dp=2, pp=2, global_batch=4, sharding=0), None),
    ("dp2xpp2-zero1-bf16-fp32acc", dict(dp=2, pp=2, global_batch=4, sharding=1), "fp32"),
    # One data-parallel rank: the fp32 copy of the partition the step hands Adam (4 B a
    # parameter) is twice the bf16 accumulator (2 B), where at dp 2 they coincide.
    ("dp1xpp4-zero0-bf16", dict(dp=1, pp=4, global_batch=4, sharding=0), None),
]


@pytest.mark.slow
def test_bf16_optimizer_state_bytes_are_priced(tmp_path, ds_extension_cache):
    """The cost model's model-state bytes of a layout DeepSpeed trains with BF16_Optimizer
    (costmodel/memory.py ``bf16_optimizer_states``) against the tensors the real optimizer
    holds once its first step has run, at the reduction after the last micro-batch's backward
    (tests/deepspeed_ranks.py ``watch_bf16_optimizer``): bf16 parameters (2 B), their bf16
    ``.grad`` (2 B) and a whole accumulator in the accumulation dtype (2 or 4 B), the fp32
    master and Adam's moments over the two data-parallel ranks (12/2 B)."""
    from frontier_llm.costmodel.layouts import from_configs
    from frontier_llm.costmodel.memory import state_bytes

    model = load_model("tiny-gpt")
    cases = [{"id": i, "model": "tiny-gpt", "layout": f, "steps": 2, "dtype": "bf16",
              "bf16_optimizer": True, "grad_accum_dtype": acc}
             for i, f, acc in BF16_OPT_CASES]
    ranks = launch(tmp_path, ds_extension_cache, 4, cases)
    for n, (case_id, fields, acc) in enumerate(BF16_OPT_CASES):
        layout = Layout(dtype="bf16", engine="deepspeed", **fields)
        for rank in ranks:
            got = rank[n]
            assert got["optimizer"] == "BF16_Optimizer", (case_id, got["optimizer"])
            held = got["bf16_optimizer"]
            assert held["accumulator_itemsize"] == (4 if acc == "fp32" else 2), held
            want = state_bytes(model, from_configs([layout]), got["coords"]["pp"],
                               reduce_fp32=True if acc == "fp32" else None)
            measured = {"params": held["lp_params"],
                        "grads": held["lp_grads"] + held["accumulator"],
                        "optimizer": held["master"] + held["moments"]}
            for key, value in measured.items():
                assert value == pytest.approx(int(want[key][0]), rel=0.005), (case_id, key,
                                                                             held, want)
            # flm bench's own count (bench/deepspeed_engine.py ``_measure``) is what the
            # optimizer holds: the accumulator, not the fp32 copy of its partition the step
            # hands Adam when it accumulates in bf16.
            bench = {"params": got["params_bytes"], "grads": got["grads_bytes"],
                     "optimizer": got["optimizer_bytes"]}
            assert bench == measured, (case_id, bench, measured)
