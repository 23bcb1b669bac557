"""Context parallelism in the cost model (issue 30).

cp = 1 reproduces the figures of the cost model before cp existed, exactly
(``tests/data/cp_golden.json``: ``predict`` of 51 layouts over every engine, schedule,
recompute mode and sharding, written from commit b016498 before the cost model learned cp);
the cp terms are checked by hand against docs/costmodel.md §"Context parallelism".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel import predict
from frontier_llm.specs.layout import Layout, Sharding

GOLDEN = json.loads((Path(__file__).parent / "data" / "cp_golden.json").read_text())


@pytest.mark.parametrize("case", GOLDEN, ids=lambda c: f"{c['model']}-{c['system']}-"
                         f"{c['layout']['engine']}")
def test_cp1_reproduces_the_figures_before_cp(case):
    fields = dict(case["layout"], sharding=Sharding.parse(case["layout"]["sharding"]))
    got = predict(load_model(case["model"]), load_system(case["system"]), Layout(**fields))
    want = case["prediction"]
    # cp_comm is the one part the cost model gained (the K/V exchange): none at cp 1.
    assert got["breakdown"]["time_s"].pop("cp_comm") == 0.0
    assert got["breakdown"] == want["breakdown"]
    for key in ("step_time_s", "peak_memory_bytes", "tokens_per_s", "mfu", "hfu", "fits"):
        assert got[key] == want[key], key
