"""Megatron-LM logs of Mixture-of-Experts runs: the experts and ep its arguments block states,
the router's load-balancing loss its iteration lines print, kept as a summary figure of the
trace. The iteration lines are the real Mixtral 8x7B excerpt of NVIDIA/Megatron-LM#756
(tests/data/trainer_logs/SOURCES.md); the arguments blocks are written here in the form
``_print_args`` prints (megatron/training/arguments.py at 309ffca: ``  name ..... value``,
sorted), since no public MoE log with its arguments block was found."""

from __future__ import annotations

from pathlib import Path

import pytest

from frontier_llm.catalog import load_model
from frontier_llm.logs.traces import LogOptions, build_trace, parse_layout_option, parse_log

DATA = Path(__file__).parent / "data" / "trainer_logs"
MIXTRAL_LOG = DATA / "megatron_lm_756_mixtral_truncated.log"
MIXTRAL = load_model("mixtral-8x7b")  # the model #756 trains


def _arguments(values: dict[str, object]) -> str:
    lines = [f"  {k} {'.' * (48 - len(k))} {v}" for k, v in values.items()]
    return ("------------------------ arguments ------------------------\n"
            + "\n".join(sorted(lines, key=str.lower))
            + "\n-------------------- end of arguments ---------------------\n")


BASE = {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 4096,
        "ffn_hidden_size": 14336, "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 1, "data_parallel_size": 8, "micro_batch_size": 1,
        "global_batch_size": 128}


def _run(tmp_path, args: dict[str, object]):
    path = tmp_path / "moe.log"
    path.write_text(_arguments({**BASE, **args}) + MIXTRAL_LOG.read_text())
    log = parse_log(path, "megatron")
    assert len(log.runs) == 1
    return path, log.runs[0]


def test_the_real_mixtral_lines_give_the_load_balancing_loss():
    run = parse_log(MIXTRAL_LOG, "megatron").runs[0]
    assert [s.load_balancing_loss for s in run.steps] == pytest.approx(
        [1.013377, 1.019612, 1.010977])


def test_moe_arguments_give_the_experts_and_ep(tmp_path):
    _, run = _run(tmp_path, {
        "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 14336,
        "moe_layer_freq": 1, "moe_shared_expert_intermediate_size": None,
        "moe_router_load_balancing_type": "aux_loss", "moe_aux_loss_coeff": 0.02,
        "moe_expert_capacity_factor": None, "expert_model_parallel_size": 8})
    assert run.layout["ep"] == 8
    assert {k: run.model[k] for k in ("num_experts", "top_k", "expert_ffn_hidden",
                                      "moe_layer_freq", "router_aux_loss")} == {
        "num_experts": 8, "top_k": 2, "expert_ffn_hidden": 14336, "moe_layer_freq": 1,
        "router_aux_loss": 0.02}
    assert "capacity_factor" not in run.model and "shared_experts" not in run.model


def test_a_list_layer_pattern_and_shared_experts(tmp_path):
    # DeepSeek-style: the first 3 blocks dense, then every block MoE; two shared experts.
    pattern = [0, 0, 0] + [1] * 29
    _, run = _run(tmp_path, {"num_experts": 64, "moe_router_topk": 6, "moe_ffn_hidden_size": 1408,
                             "moe_layer_freq": pattern,
                             "moe_shared_expert_intermediate_size": 2816,
                             "moe_expert_capacity_factor": 1.25,
                             "moe_router_load_balancing_type": "none",
                             "moe_aux_loss_coeff": 0.0})
    assert (run.model["dense_layers"], run.model["moe_layer_freq"]) == (3, 1)
    assert run.model["shared_experts"] == 2 and run.model["capacity_factor"] == 1.25
    assert "router_aux_loss" not in run.model  # no aux loss when balancing is "none"


def test_a_dense_run_reads_no_expert_field(tmp_path):
    # Megatron prints num_experts None and its MoE defaults (moe_router_topk 2) for dense runs.
    _, run = _run(tmp_path, {"num_experts": None, "moe_router_topk": 2,
                             "moe_ffn_hidden_size": None, "expert_model_parallel_size": 1,
                             "moe_layer_freq": 1})
    assert not {"num_experts", "top_k", "expert_ffn_hidden"} & set(run.model)
    assert run.layout["ep"] == 1


def test_the_trace_keeps_the_loss_and_the_ep_layout(tmp_path):
    path, run = _run(tmp_path, {"num_experts": 8, "moe_router_topk": 2,
                                "moe_ffn_hidden_size": 14336, "expert_model_parallel_size": 8})
    options = LogOptions("h100-sxm", None, parse_layout_option("sequence_parallel=true"),
                         model_spec=MIXTRAL)
    trace = build_trace(run, path, options)
    assert trace["layout"]["ep"] == 8 and trace["environment"]["world_size"] == 16
    # Step 71 is the run's first logged step (warm-up); the median of 72 and 73.
    assert trace["summary"]["trainer_load_balancing_loss"] == pytest.approx(
        (1.019612 + 1.010977) / 2)
