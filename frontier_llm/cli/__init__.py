"""The ``flm`` command line. Each command group lives in its own module with a ``register``.

A command's module is imported when that command is dispatched, not before: a ``flm bench`` rank
(hundreds per job) must not pay for pandas, SQLAlchemy or Jinja2, which other commands use.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import typing

from frontier_llm import __version__
from frontier_llm.errors import UserError

# One module per command group; each defines register(subparsers).
COMMAND_MODULES = (
    "catalog",  # flm models, flm systems
    "plan",  # flm plan, flm predict
    "memcheck",  # flm memcheck
    "bench",  # flm bench
    "store",  # flm collect, flm results, flm validate, flm db
    "sweep",  # flm sweep render|submit|status|cancel|retry
    "calibrate",  # flm calibrate [run|fit|submit] and --from-runs
    "tune",  # flm tune run|step|status|best
    "report",  # flm report scaling|layouts|errors
    "quickstart",  # flm quickstart
    "export",  # flm export
)
# Which module registers each command, so that dispatching one imports only its module.
COMMAND_MODULE = {
    "models": "catalog", "systems": "catalog", "plan": "plan", "predict": "plan",
    "memcheck": "memcheck",
    "bench": "bench", "collect": "store", "results": "store", "validate": "store", "db": "store",
    "sweep": "sweep", "calibrate": "calibrate", "tune": "tune", "report": "report",
    "quickstart": "quickstart", "export": "export",
}


class OneLineParser(argparse.ArgumentParser):
    """Bad options are one line on stderr and exit 2, as every other bad input is (no usage
    block: ``--help`` shows it). Subcommand parsers inherit the class."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or only of ``command``'s module when it is given."""
    parser = OneLineParser(
        prog="flm",
        description=(
            "frontier_llm: predict, measure and tune tensor x pipeline x sharded-data-parallel "
            "layouts for GPT training on SLURM supercomputers."
        ),
        epilog=(
            "examples:\n"
            "  flm quickstart                  # the whole loop on this machine, in minutes\n"
            "  flm plan --model gpt-1t --system frontier --gpus 3072 --top 10\n"
            "  flm predict --model gpt-175b --system frontier --tp 8 --pp 16 --dp 8 "
            "--micro-batch 1 --global-batch 1024\n"
            "  flm bench --model tiny-gpt --tp 2 --dp 2 --nproc 4 --steps 5\n"
            "\nrun 'flm COMMAND --help' for the options of one command."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"frontier_llm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in [COMMAND_MODULE[command]] if command in COMMAND_MODULE else COMMAND_MODULES:
        module = importlib.import_module(f"frontier_llm.cli.{name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # Ctrl-C while the command's modules load (torch, pandas: seconds on a busy login
        # node) is an interrupt like any other, not a traceback.
        print("flm: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    words = sys.argv[1:] if argv is None else argv
    command = next((w for w in words if not w.startswith("-")), None)
    parser = build_parser(command)
    args = parser.parse_args(words)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        from frontier_llm.specs.values import printable_path

        # A message may quote a file name or a log's text: escapes escaped, lines kept.
        text = "\n".join(printable_path(line) for line in str(exc).split("\n"))
        print(f"flm: error: {text}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("flm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `flm plan ... | head` closes the pipe early; that is not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        # A full disk, a read-only folder, a damaged database: one line, exit 2 (cli/common.py).
        # flm bench keeps its own handling: a rank's exit status means something to the job.
        from frontier_llm.cli.common import one_line_error

        line = None if args.command == "bench" else one_line_error(exc)
        if line is None:
            raise
        print(f"flm: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
