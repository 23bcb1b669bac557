"""Validated specs: the model, the system, the layout."""

from frontier_llm.specs.layout import (
    COMPONENTS,
    DType,
    Engine,
    Layout,
    ParallelConfig,
    Placement,
    PlacementKind,
    Recompute,
    Schedule,
    Sharding,
    zero_preset,
)
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.system import Efficiency, LinkTier, SystemSpec

__all__ = [
    "COMPONENTS",
    "DType",
    "Efficiency",
    "Engine",
    "Layout",
    "LinkTier",
    "ModelSpec",
    "ParallelConfig",
    "Placement",
    "PlacementKind",
    "Recompute",
    "Schedule",
    "Sharding",
    "SystemSpec",
    "zero_preset",
]
