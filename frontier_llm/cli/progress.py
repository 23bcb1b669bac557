"""Progress of long commands: a rich bar on stderr at a terminal, nothing otherwise.

Shown only while both stdout and stderr are terminals: when output goes to a file or a pipe
(scripts, CI, ``| jq``) it would be noise, and ANSI codes in a log are worse. Lines a command
logs as it goes (``log``) are printed either way: above the bar at a terminal, plainly otherwise.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any, TextIO


def terminal(*streams: TextIO) -> bool:
    """True when every stream is a terminal."""
    return all(getattr(s, "isatty", lambda: False)() for s in streams)


class Progress:
    """``with Progress("collect") as bar: bar.update(done, total)``."""

    def __init__(self, description: str, *, enabled: bool | None = None,
                 stream: TextIO | None = None) -> None:
        self.description = description
        self.stream = stream or sys.stderr
        self.enabled = terminal(sys.stdout, self.stream) if enabled is None else enabled
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if self.enabled:
            # rich loads only when a bar is shown: a batch job's flm never imports it.
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), console=Console(file=self.stream), transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.description, total=None)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(exc_type, exc, tb)
            self._bar = None

    def update(self, done: int, total: int | None = None, description: str | None = None
               ) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total,
                             description=description or self.description)

    def log(self, line: str) -> None:
        if self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False)
        else:
            print(line, file=self.stream)
