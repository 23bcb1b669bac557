"""Redraw every figure of the Frontier study into one folder:

    python analysis/redraw_all.py --out figures/                  # from the cost model
    python analysis/redraw_all.py --db sqlite:///runs/flm.db --out figures/   # and measured

(see frontier_llm/report/paper.py and docs/report.md)."""

import sys

from frontier_llm.report.paper import main

if __name__ == "__main__":
    sys.exit(main(None))
