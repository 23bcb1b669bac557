"""How flm starts a Python child of its own (a rank, a local sweep job, a microbenchmark): one
argv for all of them, independent of the folder it is started from.

``python -m MODULE`` puts the current working directory first on ``sys.path``. Started from the
folder that holds a clone named ``frontier_llm`` (the usual ``git clone`` into ``~``), the child
imported that folder, which has no ``__init__.py``, as an empty namespace package before the
editable install's finder was asked, and died on ``cannot import name '__version__'``. ``-P``
(Python 3.11, "don't prepend a potentially unsafe path to sys.path";
https://docs.python.org/3.11/using/cmdline.html#cmdoption-P) leaves the working directory out,
so the child imports the installation that ``sys.executable`` belongs to and nothing else.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

# -P: the working directory is not put on sys.path (see the module's docstring).
SAFE_PATH = "-P"


def python_module(module: str, args: Sequence[str] = (), python: str | None = None) -> list[str]:
    """``[python, -P, -m, module, *args]``: this interpreter (the installation flm runs from,
    also when flm was called by its path from an environment that is not activated) running
    ``module`` without the working directory on its import path."""
    return [python or sys.executable, SAFE_PATH, "-m", module, *args]


def flm(args: Sequence[str] = ()) -> list[str]:
    """``flm ARGS`` as a child of this process: :func:`python_module` of ``frontier_llm.cli``."""
    return python_module("frontier_llm.cli", args)


def installation_bin() -> str | None:
    """The folder of this installation's ``flm`` script (the interpreter's own ``bin``), or None
    when it has none there. A job script puts it on PATH when ``flm`` is not found by name, so a
    sweep rendered by ``/path/to/venv/bin/flm`` with that environment not activated still runs
    ``flm`` on its nodes (the job's shell found no ``flm``: ``execve(): flm: No such file``)."""
    folder = Path(sys.executable).absolute().parent
    return str(folder) if os.access(folder / "flm", os.X_OK) else None
