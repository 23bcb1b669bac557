"""What a quickstart runs, and the folder's record of it.

The folder keeps ``quickstart.json``: a second run with the same settings resumes (every stage
skips what is done), one with other settings is refused before anything runs, because the
sweep and the study it holds are tied to their files (flm sweep and flm tune refuse a changed
file under the same name, and mixing would compare unlike measurements).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from frontier_llm.catalog import SYSTEMS_DIR
from frontier_llm.errors import UserError

RECORD = "quickstart.json"
DEFAULT_SYSTEM = "cpu-local"
LOCK = "quickstart.lock"


@dataclass(frozen=True)
class Settings:
    """The quickstart's knobs. The defaults are the built-in main job (about 3 minutes of
    real runs on two cores); --layouts, --steps and --trials shrink it for CI."""

    out: Path = Path("flm-quickstart")
    model: str = "tiny-gpt"
    # The base system: the catalog's cpu-local (estimated rates) unless --system names another.
    # With calibrate (the default) the quickstart measures this machine and predicts with the
    # base calibrated here (quickstart/calibration.py); without, with the base as it is.
    system: str = DEFAULT_SYSTEM
    calibrate: bool = True
    ranks: int = 4
    global_batch: int = 8
    layouts: int = 4  # 4-rank layouts measured: the fastest predicted of each TP x PP shape
    steps: int = 4  # measured steps per run
    warmup: int = 1
    trials: int = 4  # jobs the Optuna study may run
    warm_start: int = 2  # the study's first trials: the model's favourites
    seed: int = 0

    def __post_init__(self) -> None:
        for name, low in (("ranks", 1), ("layouts", 1), ("steps", 1), ("trials", 1),
                          ("warmup", 0), ("warm_start", 0), ("global_batch", 1)):
            if getattr(self, name) < low:
                raise UserError(f"--{name.replace('_', '-')} must be at least {low} "
                                f"(got {getattr(self, name)})")
        if self.global_batch % self.ranks:
            raise UserError(f"the global batch ({self.global_batch}) must be a multiple of the "
                            f"ranks ({self.ranks})")

    @property
    def db_path(self) -> Path:
        return self.out / "flm.db"

    @property
    def calibration_dir(self) -> Path:
        return self.out / "calibration"

    @property
    def db_url(self) -> str:
        return f"sqlite:///{self.db_path.resolve()}"

    @property
    def system_file(self) -> Path:
        """The base system's YAML file: a path as given, or the catalog's file."""
        path = Path(self.system)
        return path if path.is_file() else SYSTEMS_DIR / f"{self.system}.yaml"

    def record(self) -> dict:
        """What must not change under one folder (the folder itself is where it lives)."""
        d = asdict(self)
        d.pop("out")
        return d


@contextlib.contextmanager
def claim(settings: Settings) -> Iterator[bool]:
    """Hold the folder for this quickstart while the block runs; yields True when the folder is
    new. Refuses, before anything is written: a folder made with other settings (naming them),
    a folder that is not a quickstart's, and a folder another quickstart is running in (two
    would both run the jobs waiting to run). The lock is an ``flock``, released by the OS when
    its holder dies, so a killed run leaves none behind."""
    out = settings.out
    path = out / RECORD
    mine = settings.record()
    if path.is_file():
        _check(path, mine, out)
    elif out.exists() and any(out.iterdir()):
        raise UserError(f"{out} exists and is not a quickstart folder; give another --out")
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"another flm quickstart is running in {out}; wait for it to "
                            "finish, or give another --out") from None
        new = not path.is_file()
        if new:
            path.write_text(json.dumps(mine, indent=1) + "\n")
        else:
            _check(path, mine, out)  # again, under the lock
        yield new
    finally:
        os.close(fd)


def _check(path: Path, mine: dict, out: Path) -> None:
    try:
        theirs = json.loads(path.read_text())
    except (OSError, ValueError):
        raise UserError(f"{path} is not a quickstart record; use another --out") from None
    diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if diff:
        was = ", ".join(f"{k}={theirs.get(k)}" for k in diff)
        raise UserError(f"{out} holds a quickstart made with {was}; run it again with those "
                        "settings to resume it, or give another --out")
