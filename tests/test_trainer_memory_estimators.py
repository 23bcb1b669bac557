"""flm's model-state bytes against the trainers' own estimators, and where flm differs.

Megatron-LM's ``report_theoretical_memory`` (megatron/training/theoretical_memory_usage.py,
``compute_weight_and_optimizer_memory``): 18 bytes per parameter, ``6 + 12/dp`` with the
distributed optimizer (bf16 parameter 2 + fp32 main gradient 4 + fp32 main parameter and two
moments 12, sharded over dp). DeepSpeed's ``estimate_zero2_model_states_mem_needs`` and
``estimate_zero3_model_states_mem_needs`` (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py;
imported here from the installed DeepSpeed): ``2Ψ + 18Ψ/N`` and ``4·largest_layer + 18Ψ/N``
without offload. docs/costmodel.md, "Against the trainers' estimators", tabulates the
differences these tests pin.
"""

from __future__ import annotations

import pytest

from frontier_llm.catalog import load_model
from frontier_llm.costmodel.layouts import from_configs
from frontier_llm.costmodel.memory import state_bytes
from frontier_llm.specs.layout import Engine, Layout
from frontier_llm.specs.sharding import zero_preset

MODEL = load_model("llama3-8b")


def _states(**kw) -> dict[str, float]:
    t = from_configs([Layout(tp=1, pp=1, micro_batch=1, **kw)])
    return {k: float(v[0]) for k, v in state_bytes(MODEL, t, 0).items()}


@pytest.mark.parametrize(("zero", "dp", "per_param"), [(0, 1, 18.0), (1, 8, 6 + 12 / 8)])
def test_megatron_states_are_report_theoretical_memorys(zero, dp, per_param):
    s = _states(dp=dp, global_batch=dp, sharding=zero_preset(zero), engine=Engine.MEGATRON)
    total = s["params"] + s["grads"] + s["optimizer"]
    assert total == pytest.approx(s["count"] * per_param, rel=1e-6)


def test_deepspeed_zero3_states_are_its_estimators_less_the_largest_layer():
    """ZeRO-3: the estimator's 18Ψ/N equals flm's sharded states; its ``4·largest_layer``
    (a 16-bit parameter and gradient of the largest layer) is what flm prices as gathered
    buffers (costmodel/deepspeed_buffers.py zero3_live_params), not as states."""
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    n = 8
    s = _states(dp=n, global_batch=n, sharding=zero_preset(3), engine=Engine.DEEPSPEED)
    psi = s["count"]
    _, gpu, largest = stage3.estimate_zero3_model_states_mem_needs(
        psi, 0, num_gpus_per_node=n, cpu_offload=False)
    assert largest == 0
    assert s["params"] + s["grads"] + s["optimizer"] == pytest.approx(gpu, rel=1e-6)


def test_deepspeed_zero2_states_differ_from_its_estimator_by_a_16_bit_gradient_shard():
    """ZeRO-2: the estimator counts 2Ψ + 18Ψ/N (a 16-bit and an fp32 gradient partition);
    flm 2Ψ + 16Ψ/N: the bf16 optimizer's fp32 gradient partition only, the 16-bit gradients
    being reduced through ``reduce_bucket_size`` buckets and freed (stage_1_and_2.py
    ``reduce_ready_partitions_and_remove_grads``), priced as a buffer, not a shard."""
    stage12 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    n = 8
    s = _states(dp=n, global_batch=n, sharding=zero_preset(2), engine=Engine.DEEPSPEED)
    psi = s["count"]
    _, gpu = stage12.estimate_zero2_model_states_mem_needs(psi, num_gpus_per_node=n,
                                                          cpu_offload=False)
    flm = s["params"] + s["grads"] + s["optimizer"]
    assert gpu - flm == pytest.approx(2 * psi / n, rel=1e-3)
