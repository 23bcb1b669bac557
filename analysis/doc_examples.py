"""Rerun the ``$ flm plan ...`` transcripts in the docs whose output carries an interval or a
``rests on`` line (both move when the calibration residuals do) and write their output back
in place (the header lines first, as a terminal shows them):

    python analysis/doc_examples.py docs/planner.md docs/export.md
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

MARKERS = ("intervals at", "rests on")


def rerun(path: Path) -> int:
    lines = path.read_text().split("\n")
    out, i, n = [], 0, 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        if not line.startswith("$ flm plan"):
            continue
        j = i
        while j < len(lines) and not lines[j].startswith(("$ ", "```")):
            j += 1
        if not any(m in old for old in lines[i:j] for m in MARKERS):
            continue
        run = subprocess.run([sys.executable, "-m", "frontier_llm.cli", *shlex.split(line[6:])],
                             capture_output=True, text=True)
        out.extend((run.stderr + run.stdout).rstrip("\n").split("\n"))
        i, n = j, n + 1
    path.write_text("\n".join(out))
    return n


def main() -> None:
    for name in sys.argv[1:]:
        print(f"{name}: {rerun(Path(name))} transcripts rerun")


if __name__ == "__main__":
    main()
