"""Enumerate every valid layout of a model on N GPUs, keep why rejected ones were rejected."""
