"""Pieces shared by the command modules: how a command is declared, common options, output."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas is imported by the commands that print frames, not by flm bench
    import pandas as pd


def add_command(
    sub: argparse._SubParsersAction,
    name: str,
    summary: str,
    description: str,
    examples: list[str],
    parents: list[argparse.ArgumentParser] | None = None,
) -> argparse.ArgumentParser:
    """Declare a command whose --help says what it does and shows examples."""
    return sub.add_parser(
        name,
        help=summary,
        description=description,
        epilog="examples:\n" + "\n".join(f"  {e}" for e in examples),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=parents or [],
    )


def db_parent() -> argparse.ArgumentParser:
    """``--db URL`` for every command that touches the results database."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--db",
        metavar="URL",
        default=None,
        help="database URL (sqlite:///PATH or postgresql://...); default: $FLM_DB, "
        "else sqlite:///flm.db in the working directory",
    )
    return p


def add_format(parser: argparse.ArgumentParser, choices: tuple[str, ...] = ("table", "csv", "json"),
               default: str = "table") -> None:
    parser.add_argument("--format", choices=choices, default=default,
                        help=f"output format (default: {default})")


def emit_frame(df: pd.DataFrame, fmt: str, out=None) -> None:
    """Print a DataFrame as an aligned table, CSV or JSON records."""
    import pandas as pd

    out = out or sys.stdout
    if fmt == "csv":
        from frontier_llm.report.tables import spreadsheet_safe

        spreadsheet_safe(df).to_csv(out, index=False)
    elif fmt == "json":
        # Dates as ISO 8601 text, as the CSV and table forms print them (not epoch milliseconds).
        out.write(df.to_json(orient="records", indent=1, date_format="iso") + "\n")
    else:
        if df.empty:
            out.write("(no rows)\n")
        else:
            with pd.option_context("display.width", 200, "display.max_columns", None,
                                   "display.max_colwidth", 60):
                out.write(df.to_string(index=False) + "\n")


def emit_json(obj: Any, out=None) -> None:
    (out or sys.stdout).write(json.dumps(obj, indent=1, sort_keys=False, default=str) + "\n")


def one_line_error(exc: BaseException) -> str | None:
    """The one line the user sees for an error of the machine, the file system or the
    database (exit 2 with ``flm: error:``), or None for a bug (which keeps its traceback).

    A full disk, a read-only folder, a path that is a file, a corrupted SQLite page or a
    database whose schema history this frontier_llm does not know are things to act on, not
    tracebacks. Database and URL text passes through the store's one redaction, so no password
    shows. SQLAlchemy and Alembic are looked up only where already imported: ``flm bench``
    ranks must not import them.
    """
    if isinstance(exc, OSError):
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
        what = exc.strerror or str(exc) or type(exc).__name__
        return f"{what}: {where}" if where else what
    sqlalchemy_exc = sys.modules.get("sqlalchemy.exc")
    if sqlalchemy_exc is not None and isinstance(exc, sqlalchemy_exc.SQLAlchemyError):
        from frontier_llm.store.url import redact_text

        orig = getattr(exc, "orig", None) or exc
        first = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
        hint = ""
        if "malformed" in first or "not a database" in first:
            hint = " (the file is damaged: restore it from a copy, or collect into a new one)"
        return f"database error: {redact_text(first)[:300]}{hint}"
    alembic_exc = sys.modules.get("alembic.util.exc")
    if alembic_exc is not None and isinstance(exc, alembic_exc.CommandError):
        from frontier_llm.store.url import redact_text

        return (f"database schema history: {redact_text(str(exc).splitlines()[0])[:300]} (a "
                "database written by another frontier_llm? 'flm db version' shows its version)")
    return None
