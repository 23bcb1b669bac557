"""The old home of the layout, kept for one release: use :mod:`frontier_llm.specs.layout`."""

from frontier_llm.specs.layout import (
    COMPONENTS,
    Layout,
    ParallelConfig,
    Placement,
    Sharding,
    zero_preset,
)

__all__ = ["COMPONENTS", "Layout", "ParallelConfig", "Placement", "Sharding", "zero_preset"]
