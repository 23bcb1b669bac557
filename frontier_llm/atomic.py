"""Replace a file atomically: readers see the old file or the whole new one, never a part."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_text_atomic(path: str | Path, text: str, mode: int | None = None,
                      durable: bool = False) -> Path:
    """Replace ``path`` with ``text``. The temporary file has an unpredictable name, made with
    O_EXCL by mkstemp in the target's folder: a fixed name (``.NAME.tmp``) in a shared folder
    could be a symlink planted by someone else, and writing through it would overwrite whatever
    it points to. ``os.replace`` renames over ``path`` itself, so a symlink planted there is
    replaced, never followed. ``durable``: fsync the file and its folder (a trace that must
    survive a node's crash)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        # The rename is durable only once the directory entry is.
        with contextlib.suppress(OSError):
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    return path
