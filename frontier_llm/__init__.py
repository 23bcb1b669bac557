"""frontier_llm: plan, measure and tune parallel layouts for GPT training on supercomputers."""

__version__ = "0.1.0"
