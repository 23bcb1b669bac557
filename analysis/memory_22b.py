"""Redraw the Frontier study's memory_22b figure (see docs/report.md):

    python analysis/memory_22b.py [--db URL] --out DIR
"""

import sys

from frontier_llm.report.paper import main

if __name__ == "__main__":
    sys.exit(main("memory_22b"))
