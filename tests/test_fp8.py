"""FP8 training in the cost model, the planner and the catalog (issue 52).

The FP8 terms are checked by hand against costmodel/fp8.py's docstring (docs/costmodel.md
"FP8"): linear GEMMs at the FP8 rate, attention at bf16's, per-linear cast traffic, FP8
parameter all-gathers, the FP8 weight copies; then the refusals (no FP8 tensor cores, a recipe
the GPU or engine lacks), the six new systems and the NVL72's rack-wide NVLink domain. bf16
predictions are untouched: tests/test_cp_costmodel.py's golden file and tests/test_calibration.py
cover them.
"""

from __future__ import annotations

import numpy as np
import pytest

from frontier_llm.catalog import load_model, load_system, system_names
from frontier_llm.cli import main
from frontier_llm.costmodel import comm, evaluate, fp8, predict
from frontier_llm.costmodel.layouts import from_configs
from frontier_llm.costmodel.params import layer_params_per_rank
from frontier_llm.costmodel.steptime import _rates, block_times
from frontier_llm.errors import SpecError
from frontier_llm.planner import SearchSpace, plan
from frontier_llm.specs.layout import Layout

LLAMA70 = load_model("llama3-70b")
H100 = load_system("dgx-h100")
NEW = ("dgx-h200", "dgx-b200", "gb200-nvl72", "mi300x", "mi325x", "mi355x")


def _layout(**kw):
    base = dict(tp=8, pp=1, dp=8, micro_batch=1, global_batch=64, engine="megatron",
                sharding="zero1", sequence_parallel=True)
    return Layout(**{**base, **kw})


def _blocks(system, layouts, model=LLAMA70):
    t = from_configs(layouts)
    return block_times(model, system, t, _rates(model, system, t))


def test_torchao_casts_a_weight_per_micro_batch_transformer_engine_once_per_step():
    """TransformerEngine keeps a step's FP8 weight over its micro-batches (is_first_microbatch);
    torchao casts when the layer runs. At one micro-batch a step the two cast alike; at 8 the
    Megatron row's weight traffic is an eighth of the native row's."""
    m, tokens = LLAMA70, LLAMA70.seq_len
    weights = layer_params_per_rank(m, 8)
    one = from_configs([_layout(dtype="fp8", fp8_recipe="tensorwise", engine=e, global_batch=8,
                                sharding="zero3" if e == "native" else "zero1")
                        for e in ("megatron", "native")])
    c1 = fp8.cast_bytes_per_microbatch(m, one, tokens)
    assert c1[0] == pytest.approx(c1[1])
    eight = from_configs([_layout(dtype="fp8", fp8_recipe="tensorwise", engine=e,
                                  sharding="zero3" if e == "native" else "zero1")
                          for e in ("megatron", "native")])
    c8 = fp8.cast_bytes_per_microbatch(m, eight, tokens)
    assert c8[1] - c8[0] == pytest.approx(6 * weights * (1 - 1 / 8))


def test_linears_run_at_the_fp8_rate_and_attention_at_bf16s():
    blk = _blocks(H100, [_layout(dtype="bf16"), _layout(dtype="fp8", fp8_recipe="delayed")])
    speedup = (H100.peak("fp8") * H100.eff("matmul_fp8")) / (H100.peak("bf16") * H100.eff("matmul"))
    assert blk.dense[0] / blk.dense[1] == pytest.approx(speedup)
    assert blk.attn[1] == blk.attn[0]  # the attention core stays bf16
    assert blk.softmax[1] == blk.softmax[0]


def test_cast_traffic_by_recipe():
    """Tensorwise current scaling reads each tensor once more for its amax than delayed or
    blockwise scaling: 6 against 4 bytes per element cast (costmodel/fp8.py CAST_BYTES)."""
    layouts = [_layout(dtype="bf16")] + [_layout(dtype="fp8", fp8_recipe=r)
                                         for r in ("tensorwise", "delayed", "blockwise")]
    t = from_configs(layouts)
    m = LLAMA70
    tokens = m.seq_len  # micro-batch 1, cp 1
    cast = fp8.cast_bytes_per_microbatch(m, t, tokens)
    assert cast[0] == 0.0
    h, f, tp = m.hidden, m.ffn_hidden, 8
    kv = m.kv_dim / tp
    per_token = (h + h / tp + h + f / tp) + (h / tp + 2 * kv + h + 2 * f / tp + h)
    # Megatron-LM (TransformerEngine) casts each weight once per step: 8 micro-batches here
    # (global batch 64 over dp 8 at micro-batch 1) share one weight cast.
    weights = layer_params_per_rank(m, tp) / 8
    assert cast[2] == pytest.approx(4 * (tokens * per_token + weights))
    assert cast[1] == pytest.approx(cast[2] * 6 / 4)
    assert cast[3] == cast[2]
    blk = _blocks(H100, layouts)
    # The element-wise time grows by a third of the cast traffic at the memory rate.
    r = H100.memory_bandwidth * H100.eff("memory")
    assert blk.elem[2] - blk.elem[0] == pytest.approx(cast[2] / 3 / r)


def test_fp8_step_is_faster_but_not_twice():
    bf16, f8 = (predict(LLAMA70, H100, _layout(dtype=d)) for d in ("bf16", "fp8"))
    ratio = bf16["step_time_s"] / f8["step_time_s"]
    assert 1.1 < ratio < 2.0
    # MFU is counted against the bf16 peak for both (as the sources count it).
    assert f8["mfu"] == pytest.approx(bf16["mfu"] * ratio)


def test_fp8_parameter_all_gather_halves_fsdp_traffic_only_where_the_engine_does_it():
    sys_ = load_system("dgx-b200")
    kw = dict(tp=1, dp=64, micro_batch=1, global_batch=64, engine="native", sharding="zero3",
              recompute="selective-op")
    layouts = [Layout(dtype="bf16", **kw), Layout(dtype="fp8", fp8_recipe="tensorwise", **kw),
               Layout(dtype="fp8", fp8_recipe="mxfp8", **kw)]
    t = from_configs(layouts)
    got = fp8.param_gather_bytes(t, np.array([2, 2, 2]))
    # torchao gathers float8 weights for tensorwise only; MXFP8 parameters travel in bf16.
    assert list(got) == [2, 1, 2]
    out = evaluate(LLAMA70, sys_, t)
    assert out["time_dp_comm_s"][1] < out["time_dp_comm_s"][0]


def test_fp8_weight_copies_are_a_separate_memory_piece():
    layouts = [_layout(dtype="bf16"), _layout(dtype="fp8", fp8_recipe="delayed")]
    out = evaluate(LLAMA70, H100, from_configs(layouts), fp8_params=False)
    assert out["mem_fp8_bytes"][0] == 0.0
    # TransformerEngine: an FP8 copy and its transpose of every linear weight the rank holds.
    linear = layer_params_per_rank(LLAMA70, 8)
    assert out["mem_fp8_bytes"][1] == pytest.approx(2 * LLAMA70.layers * linear)
    # The copies are allocated like any tensor: the allocator's fragmentation share of them
    # comes with them (costmodel/reserve.py), beside the saved linear inputs TransformerEngine
    # keeps in FP8 (1 byte instead of 2).
    saved = out["mem_activations_bytes"][1] - out["mem_activations_bytes"][0]
    assert saved < 0
    assert (out["peak_memory_bytes"][1] - out["peak_memory_bytes"][0]
            == pytest.approx((out["mem_fp8_bytes"][1] + saved)
                             * (1 + H100.allocator_fragmentation)))


def test_fp8_parameters_hold_the_weight_in_one_byte_and_keep_only_its_transpose():
    """--fp8-param-gather (flm's export writes it for Megatron FP8 with the distributed
    optimizer): the linear weights are FP8 tensors, 1 byte each, and TransformerEngine keeps
    their transpose beside them; master weights and moments stay in the optimizer."""
    t = from_configs([_layout(dtype="fp8", fp8_recipe="delayed")])
    off = evaluate(LLAMA70, H100, t, fp8_params=False)
    on = evaluate(LLAMA70, H100, t)  # the export's rule: FP8 parameters
    assert list(fp8.fp8_params(t)) == [True]
    linear = LLAMA70.layers * layer_params_per_rank(LLAMA70, 8)
    assert on["mem_fp8_bytes"][0] == pytest.approx(linear)
    assert off["mem_params_bytes"][0] - on["mem_params_bytes"][0] == pytest.approx(linear)
    assert on["mem_optimizer_bytes"][0] == off["mem_optimizer_bytes"][0]
    # No distributed optimizer, no FP8 parameters (arguments.py asserts it for the flag).
    plain = from_configs([_layout(dtype="fp8", fp8_recipe="delayed", sharding="zero0")])
    assert list(fp8.fp8_params(plain, True)) == [False]


def test_transformer_engine_saves_linear_inputs_in_fp8_torchao_in_bf16():
    """TE's Linear / LayerNormLinear save their FP8-cast inputs (1 byte an element): the QKV
    and MLP inputs (sequence-parallel shards), the projection's and the second MLP matrix's
    inputs; torchao saves bf16 inputs."""
    from frontier_llm.costmodel.memory import layer_activation_bytes
    m = LLAMA70
    t = from_configs([_layout(dtype="bf16"), _layout(dtype="fp8", fp8_recipe="delayed")])
    a = layer_activation_bytes(m, t)
    sb = m.seq_len * 1
    per_token = 2 * m.hidden / 8 + m.out_dim / 8 + m.ffn_hidden / 8  # one byte saved each
    assert a[0] - a[1] == pytest.approx(sb * per_token)
    kw = dict(tp=1, dp=8, micro_batch=1, global_batch=8, engine="native", sharding="zero3")
    native = from_configs([Layout(dtype="bf16", **kw),
                           Layout(dtype="fp8", fp8_recipe="tensorwise", **kw)])
    b = layer_activation_bytes(m, native)
    assert b[0] == b[1]


def test_megatron_gradient_buffer_follows_grad_reduce_in_fp32():
    """Megatron-Core's gradient buffer is fp32 under grad_reduce_in_fp32 (Megatron-LM's rule
    for bf16) and in the parameters' dtype otherwise (NeMo's MLPerf scripts)."""
    t = from_configs([_layout(dtype="fp8", fp8_recipe="delayed")])
    fp32 = evaluate(LLAMA70, H100, t)
    bf16 = evaluate(LLAMA70, H100, t, reduce_fp32=False)
    assert bf16["mem_grads_bytes"][0] == pytest.approx(fp32["mem_grads_bytes"][0] / 2)


def test_the_recipe_of_a_bf16_layout_changes_nothing():
    a, b = (predict(LLAMA70, H100, _layout(dtype="bf16", fp8_recipe=r))
            for r in ("tensorwise", "blockwise"))
    assert a == b


@pytest.mark.parametrize("system", ["dgx-a100", "frontier", "lumi-g"])
def test_gpus_without_fp8_are_refused_in_one_line(system, capsys):
    with pytest.raises(SpecError, match="no FP8 tensor cores"):
        predict(LLAMA70, load_system(system), _layout(dtype="fp8", tp=8, dp=8))
    assert main(["plan", "--model", "llama3-8b", "--system", system, "--gpus", "8",
                 "--dtype", "fp8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no FP8 tensor cores" in err[0]


def test_recipes_the_gpu_or_engine_lacks_are_refused():
    with pytest.raises(SpecError, match="mxfp8"):
        predict(LLAMA70, H100, _layout(dtype="fp8", fp8_recipe="mxfp8"))
    predict(LLAMA70, load_system("dgx-b200"), _layout(dtype="fp8", fp8_recipe="mxfp8"))
    with pytest.raises(SpecError, match="engine native does not run the delayed"):
        plan(LLAMA70, H100, 64, 64, SearchSpace(dtype="fp8", fp8_recipe=("delayed",)))
    with pytest.raises(SpecError, match="DeepSpeed has no fp8"):
        Layout(dtype="fp8", engine="deepspeed")


def test_plan_shows_the_fp8_speedup_of_the_same_layouts(capsys):
    assert main(["plan", "--model", "llama3-8b", "--system", "dgx-h200", "--gpus", "8",
                 "--dtype", "fp8", "--top", "3", "--fp8-speedup", "--format", "csv"]) == 0
    import io

    import pandas as pd

    df = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert (df["dtype"] == "fp8").all()
    assert np.allclose(df["fp8_speedup"], df["bf16_step_s"] / df["step_time_s"])
    assert (df["fp8_speedup"] > 1).all()


def test_the_six_systems_say_what_they_rest_on():
    assert set(NEW) <= set(system_names())
    for name in NEW:
        s = load_system(name)
        assert s.rests_on and s.sources.get("peak_flops") and s.sources.get("matmul"), name
        assert s.peak("fp8") == pytest.approx(2 * s.peak("bf16"), rel=0.01), name
        assert "matmul_fp8" in s.efficiency, name
        assert ("mxfp8" in s.peak_flops) == (name in ("dgx-b200", "gb200-nvl72", "mi355x")), name
    # Every new system's FP8 knob rests on a measured FP8 GEMM rate, which its sources name.
    for name in ("mi300x", "mi325x", "mi355x", "dgx-b200"):
        assert not load_system(name).efficiency["matmul_fp8"].source.startswith("ASSUMED"), name
    for name in ("mi300x", "mi325x", "mi355x"):
        assert "FP8" in load_system(name).sources["matmul_fp8"], name
    # CDNA3: both knobs are the DGX H100 transfer (0.77 / 0.803 of the H100's MAMF share) of AMD's
    # MAF table (ROCm blog, Table 1), the bf16 and FP8 columns of one tool.
    for name, maf_bf16, maf_fp8 in (("mi300x", 708e12, 1273e12), ("mi325x", 843e12, 1519e12)):
        s = load_system(name)
        transfer = 0.77 / 0.803
        assert s.eff("matmul") == pytest.approx(transfer * maf_bf16 / s.peak("bf16"), abs=0.001)
        assert s.eff("matmul_fp8") == pytest.approx(transfer * maf_fp8 / s.peak("fp8"), abs=0.001)
    # MI355X: AMD's hipBLASLt FP8 GEMM (3130.21 TFLOP/s at 8192^3) is the same share of the FP8
    # peak as the MAMF bf16 figure of the bf16 peak, so the two knobs are equal.
    mi355 = load_system("mi355x")
    assert mi355.eff("matmul_fp8") == pytest.approx(
        mi355.eff("matmul") * (3130.21 / mi355.peak("fp8")) / (1565.0 / mi355.peak("bf16")),
        abs=0.001)


def test_nvl72_groups_inside_the_rack_run_at_nvlink_speed():
    rack = load_system("gb200-nvl72")
    assert rack.gpus_per_node == 4 and rack.scale_up_domain == 72
    node = rack.links["node"].bandwidth * rack.eff("collective")
    for span in (8, 16, 72):  # tp 8, ep 16, a whole rack: beyond a 4-GPU tray
        bw, _ = comm.link_for_span(rack, span)
        assert bw == pytest.approx(node), span
    bw, _ = comm.link_for_span(rack, 144)
    assert bw < node
    # On an 8-GPU DGX the same 16-GPU group leaves the node.
    bw, _ = comm.link_for_span(load_system("dgx-b200"), 16)
    assert bw < load_system("dgx-b200").links["node"].bandwidth


def test_systems_listing_has_fp8_columns(capsys):
    import json

    assert main(["systems", "--format", "json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["gb200-nvl72"]["nvlink_domain_gpus"] == 72
    assert rows["mi355x"]["peak_mxfp4_tflops"] > rows["mi355x"]["peak_fp8_tflops"]
    assert rows["dgx-a100"]["peak_fp8_tflops"] is None or np.isnan(
        rows["dgx-a100"]["peak_fp8_tflops"])
    assert all(rows[n]["rests_on"] for n in NEW)


def test_bench_refuses_fp8_on_a_cpu(capsys):
    """flm bench runs fp8 through torchao's float8 linears on a GPU (bench/float8.py, untestable
    here); on this machine's CPU it refuses in one line before any rank starts."""
    assert main(["bench", "--model", "tiny-gpt", "--dtype", "fp8", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a GPU with FP8 tensor cores" in err[0], err
