"""The commands a user runs next on a real cluster, as argument lists (printed with shlex, and
parsed by flm's own parser in the tests, so the advice cannot drift from the commands)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

# The shipped Frontier files (the repository's sweeps/ folder).
FRONTIER_SWEEP = "sweeps/frontier-175b-weak.yaml"
FRONTIER_SWEEP_NAME = "frontier-175b-weak"
FRONTIER_STUDY = "sweeps/studies/frontier-22b-tune.yaml"
FRONTIER_STUDY_NAME = "frontier-22b-tune"
DB = "sqlite:///frontier.db"  # or postgresql://user@host/flm for a shared database


@dataclass(frozen=True)
class Step:
    why: str
    argv: tuple[str, ...]
    env: str = ""  # an environment assignment written before the command

    def line(self) -> str:
        return (f"{self.env} " if self.env else "") + shlex.join(self.argv)


def cluster_steps(account: str = "ABC123") -> list[Step]:
    out = "runs/175b-weak"
    return [
        Step("plan GPT-175B on 1024 Frontier GCDs",
             ("flm", "plan", "--model", "gpt-175b", "--system", "frontier", "--gpus", "1024",
              "--top", "10", "--explain")),
        Step("render the Frontier weak-scaling sweep and read its job scripts",
             ("flm", "sweep", "render", FRONTIER_SWEEP, "--out", out, "--account", account)),
        Step("submit it (on a login node; job state goes into the database)",
             ("flm", "sweep", "submit", FRONTIER_SWEEP, "--out", out, "--account", account,
              "--db", DB)),
        Step("wait for the jobs, classify them and store their traces",
             ("flm", "sweep", "status", FRONTIER_SWEEP_NAME, "--wait", "--collect", "--db",
              DB)),
        Step("tune 22B on 2 nodes with Optuna, each trial one SLURM job (sbatch reads the "
             "account from SBATCH_ACCOUNT)",
             ("flm", "tune", "run", FRONTIER_STUDY, "--db", DB), env=f"SBATCH_ACCOUNT={account}"),
        Step("the study's best layout",
             ("flm", "tune", "best", FRONTIER_STUDY_NAME, "--db", DB)),
        Step("scaling efficiency, measured beside predicted",
             ("flm", "report", "scaling", "--sweep", FRONTIER_SWEEP_NAME, "--predicted",
              "--gpu-label", "GCDs", "--db", DB, "--out", "reports/")),
        Step("how far the cost model is from the measurements",
             ("flm", "report", "errors", "--db", DB, "--out", "reports/")),
    ]
