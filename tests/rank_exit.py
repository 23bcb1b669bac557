"""How a test's rank script ends (machine-notes: gloo worker threads can abort the interpreter
at exit): run ``main``, print any error, flush stdout and stderr, and ``os._exit`` with its code.
``main`` itself ends with a barrier and ``destroy_process_group``."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable


def run_rank(main: Callable[..., int], *args) -> None:
    try:
        code = main(*args)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
