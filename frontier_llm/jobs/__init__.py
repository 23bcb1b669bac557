"""Sweeps as jobs: render batch scripts, submit to SLURM or run locally, classify what happened."""
