"""flm plan --explain's "why" table: one row per alternative layout, naming every knob whose
fastest alternative it is (the table printed the same layout once for tp, pp and the
interleaving), and a gap under 1 % written as a percentage (1.00x hid which was slower)."""

from __future__ import annotations

import re

from frontier_llm.catalog import load_model, load_system
from frontier_llm.planner import plan
from frontier_llm.planner.explain import _compared_knobs, explain


def test_the_why_table_names_each_alternative_once():
    p = plan(load_model("gpt-1t"), load_system("frontier"), 3072)
    text = explain(p)
    why = text.split("Why: ", 1)[1].splitlines()[1:]
    rows = [re.match(r"^\s+([a-z_, ]+?)\s+(tp\d.*?): ", r) for r in why
            if "would be faster" not in r]
    assert all(rows), why
    layouts = [m.group(2) for m in rows]
    assert len(layouts) == len(set(layouts)), why
    named = [k for m in rows for k in m.group(1).split(", ")]
    assert sorted(named) == sorted(_compared_knobs(p))  # every compared knob, once
    # One layout is the fastest alternative for several knobs: named once, with all of them.
    assert any(", " in m.group(1) for m in rows)
    assert "1.00x" not in text
