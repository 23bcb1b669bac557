"""A study against a table of past measurements instead of jobs (benchmarks, tests).

The table (benchmarks/make_tune_replay.py writes one) holds a measured throughput per point of a
study's space, keyed like :attr:`Candidate.key`. :func:`search` drives the same proposal code as
the job driver (:func:`optuna_study.ask_next`: model checks, warm start, duplicates told without
a job) and returns the measured values in the order the search asked for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import optuna
import pandas as pd

from frontier_llm.specs.vocab import RunStatus
from frontier_llm.tune import optuna_study as osx
from frontier_llm.tune.space import Candidates


def load_table(path: str | Path) -> pd.DataFrame:
    return pd.read_csv(path, comment="#")


def values_by_key(table: pd.DataFrame) -> dict[str, float | None]:
    """Measured throughput per GPU of each point; None where the run did not complete."""
    out: dict[str, float | None] = {}
    for _, r in table.iterrows():
        ok = r["status"] == RunStatus.COMPLETED and pd.notna(r["throughput_per_gpu"])
        out[r["key"]] = float(r["throughput_per_gpu"]) if ok else None
    return out


def search(cands: Candidates, values: Mapping[str, float | None], *, sampler: str, seed: int,
           warm_start: int, budget: int, n_startup_trials: int | None = None,
           max_asks: int = 1000, warm_points: list[dict] | None = None,
           stop_at: float | None = None) -> list[float | None]:
    """Measured values in the order a search asks for them, at most ``budget`` measurements.
    ``max_asks`` is high: near the end of a small space a random search needs many proposals
    to hit the last unmeasured points, and a replayed proposal costs nothing. ``warm_points``
    replaces the warm start's trials (the benchmark's comparison with other warm starts); the
    search ends early once a value reaches ``stop_at`` (what comes after is not counted)."""
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(),
                                direction="maximize")
    if warm_points is None:
        osx.warm_start(study, cands, warm_start)
    else:
        for params in warm_points:
            study.enqueue_trial(dict(params))
    seq: list[float | None] = []
    while len(seq) < budget:
        p = osx.ask_next(study, cands, sampler=sampler, seed=seed,
                         objectives=("throughput_per_gpu",), in_flight=set(),
                         n_startup_trials=n_startup_trials, max_asks=max_asks)
        if p is None:
            break
        v = values.get(p.candidate.key)
        st = study._storage
        st.set_trial_user_attr(p.trial_id, osx.A_KEY, p.candidate.key)
        if v is None:
            st.set_trial_user_attr(p.trial_id, osx.A_OUTCOME, "oom")
            osx.constrain(study, p.trial_id, 1.0)
            study.tell(p.number, [0.0])
        else:
            st.set_trial_user_attr(p.trial_id, osx.A_OUTCOME, "measured")
            osx.constrain(study, p.trial_id, 0.0)
            study.tell(p.number, [v])
        seq.append(v)
        if stop_at is not None and v is not None and v >= stop_at:
            break
    return seq


def trials_to_reach(seq: list[float | None], target: float) -> int | None:
    """1-based number of measurements until one reaches ``target`` (None: never)."""
    for i, v in enumerate(seq, 1):
        if v is not None and v >= target:
            return i
    return None
