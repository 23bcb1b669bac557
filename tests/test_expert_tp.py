"""Expert tensor parallelism (``etp``, issue 53): the experts' own tp degree, folded like ep over
a pipeline stage's tp x cp x dp ranks (Megatron-Core's MoE parallel folding; specs/axes.py).

The layout rules are Megatron-Core's (parallel_state.py ``initialize_model_parallel``); the cost
model's figures are its formulas (costmodel/moe.py) worked by hand. Nothing here is measured.
"""

from __future__ import annotations

import numpy as np
import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel import comm, moe, predict
from frontier_llm.costmodel.layouts import from_configs
from frontier_llm.costmodel.params import table_layer_params
from frontier_llm.errors import SpecError
from frontier_llm.specs import axes
from frontier_llm.specs.forms import label, layout_from_row, layout_record
from frontier_llm.specs.identity import layout_hash
from frontier_llm.specs.layout import Layout, layout_argv

QWEN = load_model("qwen3-235b-a22b")
MIXTRAL = load_model("mixtral-8x7b")
H100 = load_system("dgx-h100")


def _layout(**kw) -> Layout:
    base = dict(tp=4, pp=8, dp=8, ep=8, micro_batch=1, global_batch=1024, engine="megatron",
                sequence_parallel=True, recompute="full", sharding="zero1")
    return Layout(**{**base, **kw})


# --- the layout ------------------------------------------------------------------------------

def test_etp_equal_to_tp_is_the_default_layout():
    # 0 stands for "tp": a layout given etp = tp is the layout without it (key, hash, argv).
    given, default = _layout(etp=4), _layout()
    assert given == default and given.etp == 0 and given.expert_tp == 4
    assert layout_hash(QWEN, "dgx-h100", given) == layout_hash(QWEN, "dgx-h100", default)
    assert "--etp" not in layout_argv(default)
    assert "etp" not in label(default)


def test_etp_below_tp_folds_the_stage():
    lay = _layout(etp=1)
    assert lay.expert_tp == 1
    # edp = tp x cp x dp / (etp x ep) = 4 x 8 / 8; with etp = tp it is dp / ep = 1.
    assert axes.expert_data_parallel(lay) == 4
    assert axes.expert_data_parallel(_layout()) == 1
    assert label(lay).startswith("tp4 pp8 dp8 ep8 etp1 ")
    # The argv codec and the row codec give the layout back.
    assert "--etp" in layout_argv(lay)
    assert layout_from_row(layout_record(lay)) == lay


def test_ep_may_span_tp_ranks_when_etp_is_below_tp():
    # ep 8 does not divide dp 2, but etp x ep = 8 divides tp x dp = 8 (Megatron-Core's fold).
    with pytest.raises(SpecError, match="ep \\(8\\) does not divide dp"):
        Layout(tp=4, dp=2, ep=8, global_batch=2)
    lay = Layout(tp=4, dp=2, ep=8, etp=1, global_batch=2)
    # Expert order etp-ep-dp: ep members are consecutive ranks, tp ranks among them.
    assert [axes.coords(r, lay)["ep"] for r in range(8)] == list(range(8))
    assert axes.expert_stride(lay) == 1
    # With etp = tp the dense order's ep: consecutive dp indices, tp ranks apart.
    dense_order = Layout(tp=4, dp=8, ep=8, global_batch=8)
    assert [axes.coords(r, dense_order)["ep"] for r in range(0, 32, 4)] == list(range(8))
    assert axes.expert_stride(dense_order) == 4


def test_an_expert_fold_that_does_not_tile_the_stage_is_refused():
    with pytest.raises(SpecError, match="etp x ep \\(2 x 8\\) does not divide tp x cp x dp"):
        Layout(tp=4, dp=2, ep=8, etp=2, global_batch=2)


def test_etp_against_the_model():
    with pytest.raises(SpecError, match="etp \\(1\\) needs a Mixture-of-Experts model"):
        Layout(tp=4, dp=2, etp=1, global_batch=2).check_model(load_model("llama3-8b"))
    # expert_ffn_hidden (1536 = 2^9 x 3) splits over etp, not tp.
    with pytest.raises(SpecError, match="expert_ffn_hidden \\(1536\\) is not divisible by etp"):
        Layout(tp=4, dp=256, etp=1024, global_batch=256).check_model(QWEN)
    _layout(etp=1).check_model(QWEN)


# --- the cost model --------------------------------------------------------------------------

def test_routed_expert_parameters_split_over_etp_not_tp():
    t1, t4 = from_configs([_layout(etp=1)]), from_configs([_layout()])
    routed1, routed4 = moe.routed_params_per_rank(QWEN, t1), moe.routed_params_per_rank(QWEN, t4)
    # 128 / 8 = 16 experts a rank, each 3 x 4096 x 1536 whole (etp 1) or a quarter (etp = tp 4).
    assert routed1[0] == pytest.approx(16 * 3 * 4096 * 1536)
    assert routed1[0] == pytest.approx(4 * routed4[0])
    # The rest of the block (attention, router) is tp's either way.
    dense = table_layer_params(QWEN, t1)[0] - routed1[0]
    assert dense == pytest.approx(table_layer_params(QWEN, t4)[0] - routed4[0])
    # Their sharded state spreads over expert-dp = 4 ranks, not 1.
    assert moe.expert_degree(t1, "optim")[0] == 4 and moe.expert_degree(t4, "optim")[0] == 1


def test_expert_gemm_rows_and_widths_fold_with_etp():
    t1, t4 = from_configs([_layout(etp=1)]), from_configs([_layout()])
    # tp 4's tokens (4096) gathered over etp: 4096 x top_k 8 x ep 8 / 128 = 2048 rows a local
    # expert with etp = tp; each rank dispatching its sequence-parallel quarter with etp 1.
    assert moe.expert_rows(QWEN, t4)[0] == 2048
    assert moe.expert_rows(QWEN, t1)[0] == 512
    # The expert's weights: input (2 x 1536 / etp) x 4096, output 4096 x (1536 / etp); FLOPs
    # weigh 1/d as 2 x 1536 x 4096 / 768 + 4096 x 384 / 384 over 4096 x 1152 at etp 4: side
    # 576; four times that at etp 1.
    assert moe.expert_weight_side(QWEN, 4) == pytest.approx(576.0)
    assert moe.expert_weight_side(QWEN, 1) == pytest.approx(2304.0)
    # The smallest side, min(weight side, rows): 576 at etp 4, 512 at etp 1 (fewer rows)...
    half = H100.matmul_half_hidden
    ratio = moe.expert_gemm_slowdown(QWEN, t1, half)[0] / moe.expert_gemm_slowdown(
        QWEN, t4, half)[0]
    assert ratio == pytest.approx((576 / (576 + half)) / (512 / (512 + half)))
    # ...while at pp 4 dp 16 (ep 16: 4096 rows at etp = tp, 1024 at etp 1) etp 1 is faster.
    t1b = from_configs([_layout(etp=1, pp=4, dp=16, ep=16)])
    t4b = from_configs([_layout(pp=4, dp=16, ep=16)])
    assert moe.expert_gemm_slowdown(QWEN, t1b, half)[0] < moe.expert_gemm_slowdown(
        QWEN, t4b, half)[0]


def test_the_all_to_all_of_etp_1_stays_inside_a_node():
    t1, t4 = from_configs([_layout(etp=1)]), from_configs([_layout()])
    e = 2.0
    # Same bytes (each rank dispatches its sequence-parallel share either way)...
    assert moe.all_to_all_bytes(QWEN, t1, e)[0] == moe.all_to_all_bytes(QWEN, t4, e)[0]
    # ...over 8 consecutive ranks (one DGX node) rather than 8 ranks 4 apart (4 nodes).
    nbytes = moe.all_to_all_bytes(QWEN, t1, e)
    per_block = 4 * comm.all_to_all(H100, 8, 1, nbytes)  # full recompute adds 2 below
    assert moe.all_to_all_times(QWEN, H100, t1, e)[0] == pytest.approx(6 / 4 * per_block[0])
    assert moe.all_to_all_times(QWEN, H100, t1, e)[0] < moe.all_to_all_times(QWEN, H100, t4,
                                                                             e)[0] / 3


def test_the_expert_mlp_tp_collective_runs_over_etp():
    t1, t4 = from_configs([_layout(etp=1)]), from_configs([_layout()])
    tp_ar = np.array([1.0])
    # Every Qwen3 block is an MoE block: no MLP tp collective at etp 1; tp's at etp = tp.
    assert moe.mlp_tp_comm(QWEN, H100, t1, tp_ar, 1e6)[0] == 0.0
    assert moe.mlp_tp_comm(QWEN, H100, t4, tp_ar, 1e6)[0] == 1.0
    r1, r4 = predict(QWEN, H100, _layout(etp=1)), predict(QWEN, H100, _layout())
    # The step's tp_comm: the attention's half alone (the same recompute replays it).
    assert r1["breakdown"]["time_s"]["tp_comm"] == pytest.approx(
        r4["breakdown"]["time_s"]["tp_comm"] / 2, rel=0.05)


def test_qwen3_235b_with_etp_1_under_tp_4_predicts_the_fold():
    """The done-when of issue 53: Qwen3-235B-A22B at tp 4, etp 1, ep 8, pp 8 on 256 H100s is
    predicted with its experts folded: 4x the routed-expert parameters a rank, an in-node
    all-to-all, and a shorter step than the same layout at etp = tp."""
    r1, r4 = predict(QWEN, H100, _layout(etp=1)), predict(QWEN, H100, _layout())
    t1, t4 = r1["breakdown"]["time_s"], r4["breakdown"]["time_s"]
    assert t1["ep_comm"] < t4["ep_comm"] / 3
    assert r1["breakdown"]["memory_bytes"]["params"] > 2 * r4["breakdown"]["memory_bytes"][
        "params"]
    assert r1["step_time_s"] < r4["step_time_s"]
    assert r1["fits"]


# --- the command line and flm bench ----------------------------------------------------------

def test_flm_predict_takes_etp(capsys):
    from frontier_llm.cli import main

    assert main(["predict", "--model", "qwen3-235b-a22b", "--system", "dgx-h100", "--tp", "4",
                 "--pp", "8", "--dp", "8", "--ep", "8", "--etp", "1", "--sequence-parallel",
                 "--engine", "megatron", "--global-batch", "1024", "--zero", "1",
                 "--recompute", "full"]) == 0
    out = capsys.readouterr().out
    assert "tp4 pp8 dp8 ep8 etp1 " in out and "ep_comm" in out


def test_flm_bench_refuses_etp_other_than_tp():
    from frontier_llm.bench.mesh import check_layout
    from frontier_llm.errors import UserError

    model = load_model("tiny-moe")
    with pytest.raises(UserError, match="etp 1 with tp 2: flm bench"):
        check_layout(model, Layout(tp=2, dp=2, ep=2, etp=1, global_batch=2))
    check_layout(model, Layout(tp=2, dp=2, ep=2, etp=2, global_batch=2))  # etp = tp runs


def test_a_frame_without_etp_ran_its_experts_at_tp():
    import pandas as pd

    # A frame (or store rows) from before etp: the column is missing or empty, which is tp.
    old = pd.DataFrame({"tp": [4, 2], "dp": [8, 8], "ep": [8, 4]})
    assert list(axes.expert_tensor_parallel(old)) == [4, 2]
    new = old.assign(etp=[1.0, float("nan")])
    assert list(axes.expert_tensor_parallel(new)) == [1, 2]
    assert list(axes.expert_data_parallel(new)) == [4, 2]  # 4 x 8 / (1 x 8), 2 x 8 / (2 x 4)


def test_megatron_lm_writes_the_flag_only_where_etp_is_not_tp():
    from frontier_llm.trainers import get

    megatron = get("megatron-lm")
    folded = megatron.argv(QWEN, _layout(etp=1), "job")
    i = folded.index("--expert-tensor-parallel-size")
    assert folded[i + 1] == "1"
    assert "--expert-tensor-parallel-size" not in megatron.argv(QWEN, _layout(), "job")


def test_a_study_lists_etp_with_tp_among_its_values(tmp_path):
    """A study's etp list [1, 2] under tp 2: etp 2 is tp (stored 0), one candidate whichever
    way it is proposed; etp 1 the fold (tune/space.py _key), which a study (it runs flm bench)
    lists with bench's reason instead of a layout (bench/mesh.py check_expert_tp)."""
    from sweep_texts import local_study

    from frontier_llm.tune.spec import load_study

    path = tmp_path / "s.yaml"
    path.write_text(local_study("etp-study", "tiny-moe",
                                ["tp: [2]", "pp: [1]", "ep: [2]", "etp: [1, 2]",
                                 "sequence_parallel: [true]"]))
    c = load_study(path).candidates
    assert c.choices["etp"] == [1, 2]
    at_tp, folded = c.lookup({"etp": 2}), c.lookup({"etp": 1})
    assert at_tp.layout is not None and at_tp.layout.etp == 0 and at_tp.layout.expert_tp == 2
    assert folded.layout is None and "flm bench refuses it: etp 1 with tp 2" in folded.reason
