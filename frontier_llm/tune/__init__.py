"""Optuna studies over measured objectives, seeded and constrained by the cost model."""
