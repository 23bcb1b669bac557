"""Enumerate every valid layout of a model on N GPUs, keep why rejected ones were rejected, and
rank the rest by the cost model's predicted throughput."""

from frontier_llm.planner.plan import Plan, default_global_batch, plan
from frontier_llm.planner.space import REASONS, SearchSpace

__all__ = ["REASONS", "Plan", "SearchSpace", "default_global_batch", "plan"]
