"""Rewrite ``tests/data/cp_golden.json``'s predictions with the cost model as it stands (the
same 51 layouts; cp_comm and ep_comm, which are zero at cp 1 for a dense model, left out as the
test expects). Run it when a change moves a figure cp does not touch (a system's fitted knobs,
a term of the step), and say in the commit which figures moved:

    python analysis/cp_golden.py
"""

from __future__ import annotations

import json
from pathlib import Path

from frontier_llm.catalog import load_model, load_system
from frontier_llm.costmodel import predict
from frontier_llm.specs.layout import Layout, Sharding

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "data" / "cp_golden.json"


def main() -> None:
    cases = json.loads(GOLDEN.read_text())
    moved = 0
    for case in cases:
        fields = dict(case["layout"], sharding=Sharding.parse(case["layout"]["sharding"]))
        got = predict(load_model(case["model"]), load_system(case["system"]), Layout(**fields))
        for part in ("cp_comm", "ep_comm"):
            got["breakdown"]["time_s"].pop(part)
        new = {k: got.get(k, v) for k, v in case["prediction"].items()}
        moved += new != case["prediction"]
        case["prediction"] = new
    GOLDEN.write_text(json.dumps(cases, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}: {moved} of {len(cases)} predictions moved")


if __name__ == "__main__":
    main()
