"""The one folder DeepSpeed's C++ op is built into for the tests (``TORCH_EXTENSIONS_DIR``).

Kept across runs, so the suite builds the op at most once; keyed by the DeepSpeed and torch
versions and by this virtual environment, because the op's build file holds the environment's
paths: a cache shared by two environments is rebuilt by each in turn, and a rank of one waits
on the other's build lock (a DeepSpeed run then times out for no reason of its own).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import sys
from pathlib import Path


def extension_dir() -> str:
    """``$TORCH_EXTENSIONS_DIR`` if set, else this environment's folder (created)."""
    import torch

    venv = hashlib.sha256(sys.prefix.encode()).hexdigest()[:8]
    default = (Path.home() / ".cache" / "frontier_llm" / "torch_extensions"
               / f"deepspeed-{importlib.metadata.version('deepspeed')}-torch-{torch.__version__}"
                 f"-{venv}")
    path = os.environ.get("TORCH_EXTENSIONS_DIR") or str(default)
    Path(path).mkdir(parents=True, exist_ok=True)
    return path


def build() -> None:
    """Build (or load) DeepSpeed's CPU comm op into :func:`extension_dir` now, in one process.
    Left to the first test that starts DeepSpeed, the build could be killed with that test's
    run (a job SLURM cancels, a run a test interrupts): its lock file then stays, and every
    later DeepSpeed run in the suite waits on it until its timeout (seen on two workers)."""
    os.environ["TORCH_EXTENSIONS_DIR"] = extension_dir()
    from deepspeed.comm.torch import build_shm_op

    build_shm_op()


if __name__ == "__main__":
    build()
