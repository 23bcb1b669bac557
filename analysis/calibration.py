"""Redraw the Frontier study's calibration figure (see docs/report.md):

    python analysis/calibration.py [--csv FILE] --out DIR
"""

import sys

from frontier_llm.report.paper import main

if __name__ == "__main__":
    sys.exit(main("calibration"))
