"""The catalog: every entry loads, parameter counts match published sizes, names are checked."""

from __future__ import annotations

import pytest

from frontier_llm.catalog import load_model, load_system, model_names, system_names
from frontier_llm.errors import UserError


@pytest.mark.parametrize("name", model_names())
def test_every_model_loads(name):
    model = load_model(name)
    assert model.name == name
    assert model.num_params() > 0


@pytest.mark.parametrize("name", system_names())
def test_every_system_loads(name):
    system = load_system(name)
    assert system.peak("bf16") > 0
    assert system.links["network"].bandwidth <= system.links["node"].bandwidth


@pytest.mark.parametrize(
    ("name", "published_billions", "tolerance"),
    [
        # Published sizes: Narayanan et al. 2021 Table 1 / Korthikanti et al. 2022 Table 3 round
        # these; Llama 3 sizes from Meta's model cards (8.03B, 70.6B, 405.9B).
        ("gpt-22b", 22, 0.02),
        ("gpt-175b", 175, 0.01),
        ("gpt-530b", 530, 0.01),
        ("gpt-1t", 1000, 0.01),
        ("llama3-8b", 8.03, 0.005),
        ("llama3-70b", 70.6, 0.005),
        ("llama3-405b", 405.9, 0.005),
    ],
)
def test_parameter_counts_match_published_sizes(name, published_billions, tolerance):
    params = load_model(name).num_params() / 1e9
    assert abs(params - published_billions) / published_billions <= tolerance


def test_frontier_exposes_gcds_not_packages():
    frontier = load_system("frontier")
    assert frontier.gpus_per_node == 8
    assert frontier.gpus_per_package == 2
    assert frontier.memory_bytes == 64 * 2**30  # 64 GiB per GCD (ROCm spec table)
    assert frontier.peak("bf16") == 191.5e12
    assert frontier.link("package").bandwidth > frontier.link("node").bandwidth


def test_unknown_model_lists_valid_names():
    with pytest.raises(UserError) as err:
        load_model("gpt-176b")
    message = str(err.value)
    assert "unknown model 'gpt-176b'" in message
    assert "gpt-175b" in message and "llama3-8b" in message


def test_unknown_system_suggests_close_name():
    with pytest.raises(UserError, match="Did you mean 'frontier'"):
        load_system("fronteir")


def test_user_yaml_path_is_accepted_anywhere(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("layers: 2\nhidden: 32\nheads: 2\nseq_len: 16\nvocab: 64\n")
    model = load_model(str(path))
    assert model.name == "mine"
    assert model.layers == 2


def test_missing_yaml_path_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_model(str(tmp_path / "nope.yaml"))


def test_error_inside_a_nested_section_names_its_own_line(tmp_path):
    from frontier_llm.catalog import load_system
    from frontier_llm.errors import SpecError

    path = tmp_path / "sys.yaml"
    path.write_text(
        "name: s\ngpu: g\ngpus_per_node: 8\nmemory_bytes: 8.0e+10\n"
        "peak_flops: {bf16: 1.0e+15}\nlinks:\n  node:\n    bandwidth: 1.0e+11\n"
        "    latency: 1.0e-6\n    colour: red\n  network: {bandwidth: 1.0e+10, latency: 0.0}\n"
    )
    with pytest.raises(SpecError) as err:
        load_system(str(path))
    message = str(err.value)
    assert message.startswith(f"{path}:10: unknown field 'colour'")
    assert message.count(str(path)) == 1


@pytest.mark.parametrize("asked, first", [("h100", "dgx-h100"), ("H100", "dgx-h100"),
                                          ("a100", "dgx-a100"), ("mi250x", "frontier")])
def test_a_system_asked_by_its_chip_suggests_whole_nodes_first(asked, first):
    """``--system h100`` suggested ``h100-sxm``, a one-GPU-per-node machine (a plan on it
    prices every GPU as a node of its own); the suggestion keeps the node shape, and the
    one-GPU system is still named, as such."""
    with pytest.raises(UserError) as err:
        load_system(asked)
    message = str(err.value)
    assert f"Did you mean '{first}' (8 GPUs per node)?" in message
    if asked.lower() == "h100":
        assert "h100-sxm (one GPU alone)" in message and "grand-teton-h100 (8 per node)" in message
