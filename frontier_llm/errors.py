"""Errors the user can act on.

The CLI turns every :class:`UserError` into a one-line message and exit code 2; anything else is a
bug in frontier_llm and keeps its traceback.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Exit statuses with a meaning across processes: ``flm`` commands and ``flm bench`` ranks
    exit with them, job scripts are rendered with them (jobs/contract.py), and the job
    classifier reads them back (an OOM is 3 whether SLURM or a local process reports it)."""

    OK = 0
    FAILED = 1
    USAGE = 2  # bad input (UserError), including a job script asked for a task it lacks
    OOM = 3  # flm bench: a rank ran out of memory
    WAIT_TIMEOUT = 4  # flm sweep status --wait: the timeout passed with jobs unfinished



class UserError(Exception):
    """Bad input: an unknown name, an invalid file, an impossible request."""

    exit_code = ExitCode.USAGE


class SpecError(UserError, ValueError):
    """A model, system or layout that breaks a rule; the message names the field and the rule.

    ``field`` lets a YAML loader point at the line that holds the offending key.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field
