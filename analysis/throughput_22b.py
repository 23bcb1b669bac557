"""Redraw the Frontier study's throughput_22b figure (see docs/report.md):

    python analysis/throughput_22b.py [--db URL] --out DIR
"""

import sys

from frontier_llm.report.paper import main

if __name__ == "__main__":
    sys.exit(main("throughput_22b"))
