"""The table of docs/costmodel.md "Memory as the allocator sees it": every layout of
tests/memcheck_grid.py measured by flm memcheck beside the cost model's peak.

    python analysis/memcheck_table.py     # prints the markdown table (minutes on two cores)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from frontier_llm.bench.memcheck import measure
from frontier_llm.catalog import load_system
from frontier_llm.costmodel import moe
from frontier_llm.costmodel.layouts import from_configs
from frontier_llm.costmodel.memory import rank_memory
from frontier_llm.specs.forms import label
from tests.memcheck_grid import GRID, grid_case


def main() -> None:
    # memcheck routes every expert the mean load: no spread, no sampling noise.
    moe.load_imbalance = lambda model, t=None: 1.0
    system = load_system("dgx-h100")
    print("| layout | model (blocks) | rank (stage) | measured GiB | predicted GiB | error | "
          "peak at |")
    print("|---|---|---|---|---|---|---|")
    for name, *_ in GRID:
        model, layout = grid_case(name)
        got = measure(model, layout)
        pred = rank_memory(model, system, from_configs([layout]), got.pp_rank)
        p = float(pred["peak"][0] - pred["reserved"][0])
        print(f"| {label(layout)} | {model.name} ({model.layers}, seq {model.seq_len:,}) | "
              f"{got.rank} ({got.pp_rank}) | {got.peak_bytes / 2**30:.2f} | {p / 2**30:.2f} | "
              f"{p / got.peak_bytes - 1:+.1%} | {got.phase} |", flush=True)


if __name__ == "__main__":
    main()
