"""Validated specs: the model, the system, the layout."""

from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.parallel import (
    COMPONENTS,
    ParallelConfig,
    Placement,
    Sharding,
    zero_preset,
)
from frontier_llm.specs.system import Efficiency, LinkTier, SystemSpec

__all__ = [
    "COMPONENTS",
    "Efficiency",
    "LinkTier",
    "ModelSpec",
    "ParallelConfig",
    "Placement",
    "Sharding",
    "SystemSpec",
    "zero_preset",
]
