"""Errors the user can act on.

The CLI turns every :class:`UserError` into a one-line message and exit code 2; anything else is a
bug in frontier_llm and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input: an unknown name, an invalid file, an impossible request."""

    exit_code = 2


class SpecError(UserError, ValueError):
    """A model, system or layout that breaks a rule; the message names the field and the rule.

    ``field`` lets a YAML loader point at the line that holds the offending key.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field
