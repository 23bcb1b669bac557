"""frontier_llm: plan, measure and tune parallel layouts for GPT training on supercomputers.

The Python API (docs/api.md) is at this level: ``import frontier_llm as flm; flm.plan(...)``.
Its names are looked up in :mod:`frontier_llm.api` on first use, so that importing the package
stays cheap: ``flm bench`` ranks import it by the hundred, and a notebook that only plans never
loads torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# The stable API, kept equal to frontier_llm.api.__all__ (tests/test_api.py checks it): listed
# here too so that this module need not import the API to know its names.
__all__ = [
    "allocation", "error_table", "explain", "export_layout", "layout", "layouts_table",
    "load_model", "load_system", "plan", "plan_memory", "plot_allocation", "plot_errors",
    "plot_layouts", "plot_memory", "plot_scaling", "predict", "runs", "save_figure",
    "scaling_table", "validation",
]


def __getattr__(name: str) -> Any:
    # PEP 562: called only for names the module does not hold, so subpackages imported as
    # frontier_llm.X are untouched. importlib rather than an import statement: every module
    # that reads __version__ imports this package, and lint-imports would otherwise count that
    # as a dependency of each layer on the API above them all.
    if name in __all__:
        return getattr(importlib.import_module("frontier_llm.api"), name)
    raise AttributeError(f"module 'frontier_llm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
