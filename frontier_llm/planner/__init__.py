"""Enumerate every valid layout of a model on N GPUs, keep why each rejected one was rejected, rank."""
