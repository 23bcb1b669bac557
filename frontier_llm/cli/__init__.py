"""The ``flm`` command line. Each command group lives in its own module with a ``register``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from frontier_llm import __version__
from frontier_llm.errors import UserError

# One module per command group; each defines register(subparsers).
COMMAND_MODULES = (
    "catalog",  # flm models, flm systems
    "plan",  # flm plan, flm predict
    "bench",  # flm bench
    "store",  # flm collect, flm results, flm validate, flm db
    "sweep",  # flm sweep render|submit|status|cancel|retry
    "report",  # flm report scaling|layouts|errors
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flm",
        description=(
            "frontier_llm: predict, measure and tune tensor x pipeline x sharded-data-parallel "
            "layouts for GPT training on SLURM supercomputers."
        ),
        epilog=(
            "examples:\n"
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
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"frontier_llm.cli.{name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"flm: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("flm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `flm plan ... | head` closes the pipe early; that is not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
