"""Rerun every ``$ flm plan ...`` transcript in the docs and write its output back in place
(intervals, ``rests on`` lines and rankings move when the calibration residuals or the cost
model do):

    python analysis/doc_examples.py docs/planner.md docs/export.md

A transcript is written back in the form the doc gives it:

- its stderr lines first, then stdout, in one block (as a terminal shows them), where the old
  output had ``#`` lines;
- stdout in the command's block and stderr in the block that follows a ``stderr:`` or
  ``stderr (exit N):`` line (its exit status rewritten), where the doc splits them; only the
  first form was rerun before, so the split transcripts (the deadline curve, gpt-1t at 3,072
  GCDs) kept their old interval lines;
- stdout alone otherwise.

A line that differs from the old one only in its timing (``evaluated in 0.04 s``) is kept as
it was, so a rerun's diff holds what moved.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

FENCE = "```"
# A split transcript's label: ``stderr:`` or ``stderr (exit 1):``, ending the line.
STDERR_LABEL = re.compile(r"^stderr( \(exit \d+\))?:$")
TIMING = re.compile(r"in \d+(\.\d+)? s\b")


def _output_end(lines: list[str], i: int) -> int:
    """The index after a command's output: the next command or the block's closing fence."""
    while i < len(lines) and not lines[i].startswith(("$ ", FENCE)):
        i += 1
    return i


def _stderr_block(lines: list[str], j: int) -> tuple[int, int, int] | None:
    """Where the command block closing at ``j`` is followed by a labelled stderr block: (the
    label's index, the block's first line, its closing fence); else None."""
    if j >= len(lines) or lines[j] != FENCE:
        return None
    k = j + 1
    while k < len(lines) and not lines[k].strip():
        k += 1
    if k >= len(lines) or not STDERR_LABEL.match(lines[k]):
        return None
    label = k
    k += 1
    while k < len(lines) and not lines[k].strip():
        k += 1
    if k >= len(lines) or lines[k] != FENCE:
        return None
    end = k + 1
    while end < len(lines) and lines[end] != FENCE:
        end += 1
    return label, k + 1, end


def _keep_timing(new: list[str], old: list[str]) -> list[str]:
    """``new`` with each line that equals an old one but for its timing given as the old."""
    by_shape = {TIMING.sub("", line): line for line in old}
    return [by_shape.get(TIMING.sub("", line), line) for line in new]


def _lines(text: str) -> list[str]:
    text = text.rstrip("\n")
    return text.split("\n") if text else []


def rerun(path: Path) -> int:
    lines = path.read_text().split("\n")
    out, i, n = [], 0, 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        if not line.startswith("$ flm plan"):
            continue
        j = _output_end(lines, i)
        old = lines[i:j]
        run = subprocess.run([sys.executable, "-m", "frontier_llm.cli", *shlex.split(line[6:])],
                             capture_output=True, text=True)
        stdout, stderr = _lines(run.stdout), _lines(run.stderr)
        split = _stderr_block(lines, j)
        n += 1
        if split is not None:
            label, start, end = split
            out.extend(_keep_timing(stdout, old))
            out.extend(lines[j:label])
            word = "stderr:" if run.returncode == 0 and "(exit" not in lines[label] else (
                f"stderr (exit {run.returncode}):")
            out.append(word)
            out.extend(lines[label + 1:start])
            out.extend(_keep_timing(stderr, lines[start:end]))
            i = end
            continue
        combined = any(old_line.startswith("#") for old_line in old)
        out.extend(_keep_timing(stderr + stdout if combined else stdout, old))
        i = j
    path.write_text("\n".join(out))
    return n


def main() -> None:
    for name in sys.argv[1:]:
        print(f"{name}: {rerun(Path(name))} transcripts rerun")


if __name__ == "__main__":
    main()
