"""Redraw the Frontier study's strong_scaling figure (see docs/report.md):

    python analysis/strong_scaling.py [--db URL] --out DIR
"""

import sys

from frontier_llm.report.paper import main

if __name__ == "__main__":
    sys.exit(main("strong_scaling"))
