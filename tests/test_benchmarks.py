"""Every benchmark runs (issue 24): each ``benchmarks/*.py`` in its ``--quick`` mode, as a user
would start it, must exit 0 and print its figures, one of them a ratio against the baseline it
measures in the same run. The files are found by globbing, so a new benchmark cannot escape.

Only the shape of the output is asserted, never a value or a duration: the targets live in the
benchmarks (docs give their figures), and a timed unit test on shared cores would fail at random.
Each run also must leave nothing behind: no process of its session, no file in its temporary
folder (torch's own compile cache aside) or its working directory.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ds_cache import extension_dir
from processes import in_session

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted((REPO / "benchmarks").glob("*.py"))

# Fixtures a benchmark needs beyond a Python and the package (the SLURM it submits to).
NEEDS = {"bench_sweep": "slurm_cluster"}
MARKS = {"bench_sweep": [pytest.mark.slurm]}

# A figure: a number; the ratio line: "ratio" or "speed-up" and a number after it on its line.
NUMBER = re.compile(r"\d")
RATIO = re.compile(r"\b(ratio|speed-up)\b.*\d", re.IGNORECASE)
TIMEOUT_S = 300

pytestmark = pytest.mark.slow


def _cache(relative: Path) -> bool:
    """torch's compile cache, which torch itself keeps in the temporary folder across runs."""
    return len(relative.parts) > 1 and relative.parts[1].startswith("torchinductor_")


def test_every_benchmark_is_found() -> None:
    names = {p.stem for p in BENCHMARKS}
    assert {"bench_planner", "bench_sweep", "bench_ingest"} <= names, names
    assert set(NEEDS) <= names, "NEEDS names a benchmark that is gone"


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem, marks=MARKS.get(p.stem, []))
                                  for p in BENCHMARKS])
def test_quick_mode_runs_and_prints_figures(path: Path, tmp_path: Path,
                                            request: pytest.FixtureRequest) -> None:
    # DeepSpeed's comm op from the suite's one build (tests/ds_cache.py), not a build of its own
    # into the user's ~/.cache/torch_extensions (a minute of compiling on a fresh machine).
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path / "tmp"),
           "TORCH_EXTENSIONS_DIR": extension_dir()}
    if path.stem in NEEDS:
        cluster = request.getfixturevalue(NEEDS[path.stem])
        env.update(cluster.env())
    (tmp_path / "tmp").mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    t0 = time.monotonic()
    # Its own session: whatever it starts and leaves running is found (and ended) afterwards.
    proc = subprocess.Popen([sys.executable, str(path), "--quick"], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{path.name} --quick ran over {TIMEOUT_S} s:\n{out[-3000:]}\n{err[-3000:]}")
    seconds = time.monotonic() - t0
    left = in_session(proc.pid)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):  # it may end on its own meanwhile
            os.kill(pid, signal.SIGKILL)
    print(f"{path.name} --quick: {seconds:.1f} s")
    said = f"{path.name} --quick (exit {proc.returncode}, {seconds:.1f} s):\n{out[-3000:]}\n" \
           f"stderr:\n{err[-3000:]}"
    assert proc.returncode == 0, said
    lines = out.splitlines()
    ratio = [line for line in lines if RATIO.search(line)]
    assert ratio, f"no ratio line\n{said}"
    assert [line for line in lines if NUMBER.search(line) and line not in ratio], \
        f"no figure besides the ratio\n{said}"
    assert not left, f"processes left running: {left}\n{said}"
    leftovers = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")
                       if p.parent != tmp_path and not _cache(p.relative_to(tmp_path)))
    assert not leftovers, f"files left behind: {leftovers[:10]}\n{said}"
