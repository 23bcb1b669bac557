"""A small results database built from real ``flm bench`` runs, for the report tests and the
notebooks: tiny-gpt on 1, 2 and 4 local gloo ranks (CPU), collected with ``flm collect``.

* sweep ``tiny-weak``: micro-batch 2 per rank, global batch 2 x dp (fixed work per rank) at
  dp 1 (run twice: a repeat), 2 and 4;
* sweep ``tiny-strong``: global batch 4 at dp 1, 2 and 4, plus a dp-2 run whose last rank
  crashes at its first step (a real failed run, ``--fault crash``).

Built once per test session (a module-level singleton: a session fixture imported into several
test modules would otherwise be built once per module) into a temporary folder removed at exit.
Eight runs, about a minute on two cores.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY = ["--model", "tiny-gpt", "--dtype", "fp32", "--steps", "2", "--warmup", "1"]
# (run id, sweep, bench arguments); run ids sort in this order.
RUNS = (
    ("w1a", "tiny-weak", ["--dp", "1", "--micro-batch", "2", "--global-batch", "2"]),
    ("w1b", "tiny-weak", ["--dp", "1", "--micro-batch", "2", "--global-batch", "2",
                          "--seed", "1"]),
    ("w2", "tiny-weak", ["--dp", "2", "--micro-batch", "2", "--global-batch", "4"]),
    ("w4", "tiny-weak", ["--dp", "4", "--micro-batch", "2", "--global-batch", "8"]),
    ("s1", "tiny-strong", ["--dp", "1", "--micro-batch", "1", "--global-batch", "4"]),
    ("s2", "tiny-strong", ["--dp", "2", "--micro-batch", "1", "--global-batch", "4"]),
    ("s2-crash", "tiny-strong", ["--dp", "2", "--micro-batch", "1", "--global-batch", "4",
                                 "--fault", "crash", "--fault-step", "0"]),
    ("s4", "tiny-strong", ["--dp", "4", "--micro-batch", "1", "--global-batch", "4"]),
)
PARALLEL = 2  # bench runs at once: the machine has two cores


@dataclass(frozen=True)
class BenchDB:
    url: str
    directory: Path
    traces: Path


def _env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PMI_", "OMPI_")) and k not in (
               "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")}
    return {**out, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


class _Builder:
    def __init__(self) -> None:
        self.db: BenchDB | None = None

    def get(self) -> BenchDB:
        if self.db is None:
            directory = Path(tempfile.mkdtemp(prefix="flm-report-"))
            atexit.register(shutil.rmtree, directory, True)
            self.db = build(directory)
        return self.db


def build(directory: Path) -> BenchDB:
    traces = directory / "traces"
    flm = [sys.executable, "-m", "frontier_llm.cli"]
    pending = list(RUNS)
    running: list[tuple[str, subprocess.Popen]] = []
    while pending or running:
        while pending and len(running) < PARALLEL:
            run_id, sweep, argv = pending.pop(0)
            cmd = [*flm, "bench", *TINY, *argv, "--trace-dir", str(traces), "--run-id", run_id,
                   "--label", f"sweep={sweep}", "--label", f"job_key={run_id}"]
            running.append((run_id, subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE,
                                                     stderr=subprocess.STDOUT, text=True)))
        run_id, proc = running.pop(0)
        out, _ = proc.communicate(timeout=300)
        expected = 1 if run_id.endswith("crash") else 0
        assert proc.returncode == expected, f"bench {run_id} exited {proc.returncode}: {out}"
    url = f"sqlite:///{directory / 'flm.db'}"
    done = subprocess.run([*flm, "collect", str(traces), "--db", url, "--quiet"], env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "8 new" in done.stdout, done.stdout + done.stderr
    return BenchDB(url, directory, traces)


BENCH_DB = _Builder()


@pytest.fixture
def bench_db() -> BenchDB:
    """The session's database of real tiny-gpt bench runs (read it, never write to it)."""
    return BENCH_DB.get()


def check_png(path: Path, min_px: tuple[int, int] = (400, 250)) -> None:
    """A PNG a person could read: big enough, not blank, more than one colour."""
    import matplotlib.image as mpimg
    import numpy as np

    img = mpimg.imread(path)
    h, w = img.shape[:2]
    assert w >= min_px[0] and h >= min_px[1], f"{path}: {w}x{h} px"
    rgb = img[..., :3].reshape(-1, 3)
    colours = np.unique((rgb * 255).astype(np.uint8), axis=0)
    assert len(colours) > 2, f"{path}: {len(colours)} colours"
    ink = (rgb < 0.9).any(axis=1).mean()  # share of pixels that are not (near) white
    assert 0.01 < ink < 0.9, f"{path}: {ink:.1%} of the pixels drawn"


def check_pdf(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(b"%PDF") and b"/Type /Page" in data, path
