"""Sharded data parallelism from physics: the step time moves the way the physics says it must
(more bandwidth never slower, more prefetch never slower, a bigger data-parallel group at a fixed
global batch never faster per GPU once start-up costs dominate), the exposed time is what the
per-layer schedule leaves uncovered, and the memory terms follow each engine's buffers."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel import behaviour as beh
from frontier_llm.costmodel import comm, evaluate, predict
from frontier_llm.costmodel.layouts import from_configs
from frontier_llm.costmodel.memory import gathered_bytes, loss_bytes
from frontier_llm.costmodel.params import layer_params_per_rank, stage_params_per_rank
from frontier_llm.specs.layout import Engine, Layout, Sharding

# (model, system, layout fields): sharded layouts of each engine and group shape.
CASES = [
    ("gpt-175b", "dgx-a100", dict(dp=384, micro_batch=4, global_batch=1536, sharding=3,
                                  recompute="full", engine="deepspeed")),
    ("llama3-8b", "dgx-h100", dict(dp=8, micro_batch=2, global_batch=16, sharding=3,
                                   recompute="selective", engine="native")),
    ("gpt3-13b", "dgx-h100", dict(tp=2, dp=64, micro_batch=1, global_batch=256, sharding=3,
                                  engine="native")),
    # HSDP: parameters sharded inside a node (8 ranks), replicated across nodes.
    ("gpt3-6.7b", "frontier", dict(dp=64, micro_batch=1, global_batch=256, engine="native",
                                   sharding=Sharding.parse({"params": "partial:8",
                                                            "grads": "partial:8",
                                                            "optim": "partial:8"}))),
    ("gpt3-6.7b", "dgx-a100", dict(dp=32, micro_batch=2, global_batch=64, sharding=1,
                                   engine="megatron")),
]


def _step(model, system, **fields) -> float:
    return predict(load_model(model) if isinstance(model, str) else model, system,
                   Layout(**fields))["step_time_s"]


def _scaled_links(system, factor):
    links = {k: dataclasses.replace(v, bandwidth=v.bandwidth * factor)
             for k, v in system.links.items()}
    return dataclasses.replace(system, links=links)


@pytest.mark.parametrize(("model", "system", "fields"), CASES,
                         ids=[f"{m}-{f['engine']}" for m, _, f in CASES])
def test_more_bandwidth_is_never_slower(model, system, fields):
    base = load_system(system)
    times = [_step(model, _scaled_links(base, k), **fields) for k in (0.25, 0.5, 1, 2, 4)]
    assert all(b <= a * (1 + 1e-12) for a, b in itertools.pairwise(times)), times
    assert times[0] > times[-1]  # and communication is in the step at all


@pytest.mark.parametrize(("model", "system", "fields"), CASES[:4],
                         ids=[f"{m}-{f['engine']}" for m, _, f in CASES[:4]])
def test_more_prefetch_is_never_slower(monkeypatch, model, system, fields):
    """Prefetch depth 0 (every gather exposed), a small prefetch bucket, whole layers."""
    engine = Engine(fields["engine"]).code
    times = []
    for depth, bucket in ((0, 0), (1, 10_000_000), (1, 100_000_000), (1, 0), (2, 0)):
        for name, value in (("prefetch", depth), ("prefetch_bucket_params", bucket)):
            arr = beh.BEHAVIOUR[name].copy()
            arr[engine] = value
            monkeypatch.setitem(beh.BEHAVIOUR, name, arr)
        times.append(_step(model, load_system(system), **fields))
    assert all(b <= a * (1 + 1e-12) for a, b in itertools.pairwise(times)), times
    assert times[0] > times[3]  # prefetching hides something in every case here


@pytest.mark.parametrize(("model", "engine"), [("gpt3-1.3b", "native"),
                                                ("gpt-175b", "deepspeed")])
def test_bigger_dp_at_fixed_global_batch_is_never_faster_per_gpu(model, engine):
    """ZeRO-3 at a fixed global batch: each doubling of dp halves every GPU's compute but not
    its share of the gathers (each rank still receives every layer) and adds start-ups, so
    throughput per GPU can only fall once communication is exposed (Narayanan et al. 2021,
    Table 2: 144 -> 88 -> 44 TFLOP/s from 384 to 1536 GPUs)."""
    m, s = load_model(model), load_system("dgx-a100")
    batch = 1536
    per_gpu = []
    for dp in (192, 384, 768, 1536):
        p = predict(m, s, Layout(dp=dp, micro_batch=batch // dp, global_batch=batch, sharding=3,
                                 recompute="full", engine=engine))
        per_gpu.append(p["tokens_per_s"] / dp)
    assert all(b <= a for a, b in itertools.pairwise(per_gpu)), per_gpu
    assert per_gpu[-1] < 0.6 * per_gpu[1]


def test_start_up_costs_dominate_small_messages_at_large_dp():
    """A small model sharded over many ranks: most of the exposed gather time is the ring's
    (n − 1) start-ups, not bytes; with zero latency the same layout is much faster."""
    m, s = load_model("gpt3-125m"), load_system("dgx-h100")
    fields = dict(dp=4096, micro_batch=1, global_batch=4096, sharding=3, engine="native")
    no_latency = dataclasses.replace(s, links={k: dataclasses.replace(v, latency=0.0)
                                               for k, v in s.links.items()})
    with_lat = predict(m, s, Layout(**fields))["breakdown"]["time_s"]["dp_comm"]
    without = predict(m, no_latency, Layout(**fields))["breakdown"]["time_s"]["dp_comm"]
    assert with_lat > 5 * without


def test_without_prefetch_every_gather_is_exposed(monkeypatch):
    """With compute far longer than the gathers, prefetch hides every layer's gathers but the
    first: turning it off exposes the other (layers − 1) forward and backward gathers whole."""
    from frontier_llm.costmodel import comm

    m, s = load_model("gpt3-6.7b"), load_system("dgx-h100")
    t = from_configs([Layout(dp=8, micro_batch=8, global_batch=64, sharding=3, engine="native")])
    ag = float(comm.all_gather(s, 8, 1, layer_params_per_rank(m, 1) * 2))
    prefetched = evaluate(m, s, t)["time_dp_comm_s"][0]
    arr = beh.BEHAVIOUR["prefetch"].copy()
    arr[Engine.NATIVE.code] = 0
    monkeypatch.setitem(beh.BEHAVIOUR, "prefetch", arr)
    serial = evaluate(m, s, t)["time_dp_comm_s"][0]
    # one micro-batch per rank (64 / (8 × 8))
    assert serial - prefetched == pytest.approx((m.layers - 1) * 2 * ag, rel=1e-6)


def test_hsdp_shards_inside_the_node_and_reduces_across_once_per_step():
    """HSDP's per-micro-batch gathers stay on the node link: a slower network changes only the
    once-per-step all-reduce across replicas, so more micro-batches do not multiply it."""
    m, s = load_model("gpt3-6.7b"), load_system("dgx-h100")
    hsdp = Sharding.parse({"params": "partial:8", "grads": "partial:8", "optim": "partial:8"})

    def dp_comm(system, batch):
        return predict(m, system, Layout(dp=64, micro_batch=1, global_batch=batch,
                                         sharding=hsdp, engine="native"))[
            "breakdown"]["time_s"]["dp_comm"]

    slow_net = dataclasses.replace(s, links={**s.links, "network": dataclasses.replace(
        s.links["network"], bandwidth=s.links["network"].bandwidth / 10)})
    extra_1 = dp_comm(slow_net, 64) - dp_comm(s, 64)
    extra_4 = dp_comm(slow_net, 256) - dp_comm(s, 256)
    assert extra_1 > 0
    assert extra_4 == pytest.approx(extra_1, rel=1e-6)


def test_gathered_buffers_follow_prefetch_and_resharding():
    m = load_model("gpt3-6.7b")
    e = 2
    n_layer = layer_params_per_rank(m, 1)
    n_rest = stage_params_per_rank(m, 1, 1, 0) - m.layers * n_layer  # embeddings and head
    native = from_configs([Layout(dp=8, global_batch=8, sharding=3, engine="native")])
    # One layer in use, one prefetched, its bf16 gradient and the fp32 copy reduced; the root
    # unit (embeddings, head) with its gradient.
    assert gathered_bytes(m, native)[0] == n_layer * (2 * e + e + 4) + n_rest * (2 * e + 4)
    ds = from_configs([Layout(dp=8, global_batch=8, sharding=3, engine="deepspeed")])
    assert gathered_bytes(m, ds)[0] == n_layer * (2 * e + e) + n_rest * 2 * e  # bf16 reduce
    unsharded = from_configs([Layout(dp=8, global_batch=8, sharding=1, engine="megatron")])
    assert gathered_bytes(m, unsharded)[0] == 0


def test_loss_temporaries_are_vocabulary_sized_on_the_last_stage():
    """PyTorch's cross-entropy backward holds two fp32 sequence × vocabulary tensors beside the
    saved log-probabilities: several GB for a 128K vocabulary (Llama 3)."""
    m = load_model("llama3-8b")
    t = from_configs([Layout(dp=8, micro_batch=2, global_batch=16, sharding=3, engine="native")])
    got = loss_bytes(m, t)[0]
    assert got == 8 * m.seq_len * 2 * m.vocab
    assert got > 4e9
    p = predict(m, load_system("dgx-h100"), Layout(dp=8, micro_batch=2, global_batch=16,
                                                   sharding=3, engine="native"))
    parts = p["breakdown"]["memory_bytes"]
    assert parts["loss"] == got
    assert sum(parts.values()) == pytest.approx(p["peak_memory_bytes"])


def test_engine_argument_must_agree_with_the_layout():
    m, s = load_model("tiny-gpt"), load_system("cpu-local")
    layout = Layout(dtype="fp32")
    assert predict(m, s, layout, engine="native") == predict(m, s, layout)
    with pytest.raises(ValueError, match="engine"):
        predict(m, s, layout, engine="megatron")


def test_vectorized_and_scalar_paths_agree_across_engines():
    m, s = load_model("gpt3-6.7b"), load_system("dgx-h100")
    layouts = [Layout(dp=16, global_batch=64, sharding=z, engine=e)
               for e in ("native", "deepspeed") for z in (0, 1, 3)]
    table = evaluate(m, s, from_configs(layouts))
    for i, lay in enumerate(layouts):
        assert predict(m, s, lay)["step_time_s"] == pytest.approx(
            table["step_time_s"][i], rel=1e-12)
    assert np.all(np.isfinite(table["step_time_s"]))


@pytest.mark.parametrize("engine", ["native", "megatron", "deepspeed"])
def test_uneven_pipeline_slowest_rank_paces_and_fullest_sets_memory(engine):
    """70 layers on 12 stages (a run the old model refused): every engine splits them
    5, 6 × 10, 5; the six-layer ranks set the pace and, holding one micro-batch fewer than rank 0
    but a layer more per micro-batch, the peak memory (on rank 1, the earliest of them)."""
    from frontier_llm.costmodel.split import pipeline_ranks
    from frontier_llm.specs.pipeline_split import stage_layers

    m = dataclasses.replace(load_model("gpt-22b"), layers=70)
    s = load_system("dgx-a100")
    layout = Layout(tp=8, pp=12, micro_batch=1, global_batch=64, recompute="full",
                    flash_attention=True, sharding=1, engine=engine)
    t = from_configs([layout])
    split = stage_layers(70, 12, 1, engine, m)
    ranks = pipeline_ranks(m, t)
    assert (ranks["first"][0], ranks["mid_held"][0], ranks["last"][0]) == (
        split[0], max(split[1:-1]), split[-1])
    p = predict(m, s, layout)
    assert sum(p["breakdown"]["time_s"].values()) == pytest.approx(p["step_time_s"], rel=1e-9)
    # The pace: a six-layer rank; an even 72-layer split (6 per rank) takes as long per
    # micro-batch, up to the head and the bubble's average.
    even = predict(dataclasses.replace(m, layers=72), s, layout)["breakdown"]["time_s"]
    got = p["breakdown"]["time_s"]
    assert got["compute"] == pytest.approx(even["compute"], rel=1e-9)
    assert p["breakdown"]["peak_memory_stage"] == 1


def _dp_comm(model, system, **fields) -> float:
    return predict(model, system, Layout(**fields))["breakdown"]["time_s"]["dp_comm"]


def test_deepspeed_zero2_reduces_every_micro_batch_zero1_once_per_step():
    """DeepSpeed's ZeRO-2 reduces its gradients after every micro-batch (measured on the real
    engine: tests/test_bench_deepspeed.py), ZeRO-1 once per step. On a network slow enough that
    one reduction outlasts a micro-batch's backward, four micro-batches expose four times
    ZeRO-2's reduction and leave ZeRO-1's, and Megatron-LM's ZeRO-1, unchanged."""
    m, s = load_model("gpt3-6.7b"), load_system("dgx-a100")
    slow = dataclasses.replace(s, links={**s.links, "network": dataclasses.replace(
        s.links["network"], bandwidth=s.links["network"].bandwidth / 20)})
    base = dict(dp=64, micro_batch=1, dtype="bf16")

    def exposed(engine, zero, micro_batches):
        return _dp_comm(m, slow, **base, engine=engine, sharding=zero,
                        global_batch=64 * micro_batches)

    z2 = [exposed("deepspeed", 2, k) for k in (1, 4)]
    assert z2[0] > 0
    # Each micro-batch exposes the same reduction; the parameter gather in the step is paid once.
    gather = float(comm.all_gather(slow, 64, 1, stage_params_per_rank(m, 1, 1, 0) * 2, True))
    assert z2[1] - gather == pytest.approx(4 * (z2[0] - gather), rel=1e-6)
    for engine in ("deepspeed", "megatron"):
        z1 = [exposed(engine, 1, k) for k in (1, 4)]
        assert z1[1] == pytest.approx(z1[0], rel=1e-6), engine


def test_deepspeed_exposes_what_it_issues_outside_backward():
    """DeepSpeed's ZeRO-0 all-reduces after backward and its ZeRO-1 gathers the updated
    parameters inside the optimizer step: both exposed whole, where Megatron-LM overlaps the
    same collectives with backward and the next forward (its --overlap-grad-reduce /
    --overlap-param-gather)."""
    m, s = load_model("gpt3-1.3b"), load_system("dgx-a100")
    n = stage_params_per_rank(m, 1, 1, 0)
    base = dict(dp=64, micro_batch=4, global_batch=256, dtype="bf16")
    all_reduce = float(comm.all_reduce(s, 64, 1, n * 2, True))
    gather = float(comm.all_gather(s, 64, 1, n * 2, True))
    assert _dp_comm(m, s, **base, engine="deepspeed", sharding=0) == pytest.approx(all_reduce)
    # ZeRO-1: the reduction hides behind the last micro-batch's backward (overlap_comm) but for
    # its last bucket; the gather does not hide.
    assert _dp_comm(m, s, **base, engine="deepspeed", sharding=1) >= gather
    assert _dp_comm(m, s, **base, engine="megatron", sharding=0) < 0.2 * all_reduce
    assert _dp_comm(m, s, **base, engine="megatron", sharding=1) < 0.2 * gather
