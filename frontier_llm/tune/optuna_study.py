"""The Optuna side of a study: storage in the results database, samplers, proposals.

Proposals go through :func:`ask_next`, shared by the job driver and the replay benchmark, so the
model's part is the same in both: a proposal that breaks a layout rule or that the cost model
predicts not to fit is told at once as infeasible (Optuna constraints, so the sampler learns the
boundary) and never becomes a job; a proposal already measured is told the same values.

Determinism: each ask gets a sampler seeded from the study's seed and the number of trials so
far. A fresh process (``flm tune step`` from cron) therefore proposes what a long-lived one
would, and a seed gives the same sequence of proposals.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

from frontier_llm.errors import UserError
from frontier_llm.tune.space import NO_FIT, Candidate, Candidates

# User attributes every trial may carry (optuna-dashboard shows them).
A_OUTCOME = "flm_outcome"  # measured | oom | timeout | failed | invalid | predicted_oom |
#                            duplicate | duplicate_in_flight
A_CONSTRAINT = "flm_constraint"  # [c]; c > 0 violates
A_KEY = "flm_key"
A_REASON = "flm_reason"
A_PREDICTION = "flm_prediction"
A_SAME_AS = "flm_same_as"
A_SWEEP = "flm_sweep"
A_LAYOUT = "flm_layout"
A_CLASSIFICATION = "flm_classification"
A_WARM = "flm_warm_start"
MEASURED_OUTCOMES = ("measured", "oom", "timeout")

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def make_storage(url: str) -> RDBStorage:
    """Optuna's RDB storage on the results database (its tables beside the flm_ ones)."""
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs = {"connect_args": {"timeout": 60}}
    return RDBStorage(url, engine_kwargs=kwargs)


def constrain(study: optuna.Study, trial_id: int, value: float) -> None:
    """Record the trial's feasibility (> 0 violates) where samplers read it (Optuna >= 5:
    ``Trial.set_constraint``) and as a user attribute people can read."""
    optuna.trial.Trial(study, trial_id).set_constraint("fits", float(value))
    study._storage.set_trial_user_attr(trial_id, A_CONSTRAINT, [float(value)])


def make_sampler(kind: str, seed: int, cands: Candidates,
                 n_startup_trials: int | None = None) -> optuna.samplers.BaseSampler:
    s = optuna.samplers
    if kind == "tpe":
        kw = {} if n_startup_trials is None else {"n_startup_trials": n_startup_trials}
        return s.TPESampler(seed=seed, multivariate=True, **kw)
    if kind == "gp":
        return s.GPSampler(seed=seed)
    if kind == "nsgaii":
        return s.NSGAIISampler(seed=seed)
    if kind == "random":
        return s.RandomSampler(seed=seed)
    if kind == "grid":
        return s.GridSampler({k: list(v) for k, v in cands.choices.items()}, seed=seed)
    raise UserError(f"unknown sampler {kind!r}")


def ask_seed(seed: int, n_trials: int) -> int:
    return (seed * 1_000_003 + n_trials * 7919) % (2**32)


def identity_mismatch(study: optuna.Study, identity: str) -> str | None:
    stored = study.user_attrs.get("flm_identity")
    if stored is None or stored == identity:
        return None
    a, b = json.loads(stored), json.loads(identity)
    diff = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return ", ".join(diff)


def open_study(name: str, storage: RDBStorage, directions: list[str], identity: str,
               attrs: Mapping[str, Any], where: str) -> tuple[optuna.Study, bool]:
    """Create the study or load it; a stored study with another space is refused.
    Returns (study, created)."""
    try:
        study = optuna.create_study(study_name=name, storage=storage, directions=directions)
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage)
        created = False
    diff = identity_mismatch(study, identity)
    if diff:
        raise UserError(f"study {name} exists in {where} with a different {diff}; give the "
                        "changed study a new name (study: name: ...)")
    if [d.name.lower() for d in study.directions] != directions:
        raise UserError(f"study {name} exists in {where} with other objectives")
    if "flm_identity" not in study.user_attrs:
        study.set_user_attr("flm_identity", identity)
        for k, v in attrs.items():
            study.set_user_attr(k, v)
    return study, created


def warm_start(study: optuna.Study, cands: Candidates, k: int) -> int:
    """Enqueue the K distinct layouts the cost model predicts fastest (once per study;
    :meth:`Candidates.warm_start_points`)."""
    if k <= 0 or study.user_attrs.get("flm_warm_started"):
        return 0
    top = cands.warm_start_points(k)
    for rank, params in enumerate(top, 1):
        study.enqueue_trial(params, user_attrs={A_WARM: rank}, skip_if_exists=True)
    study.set_user_attr("flm_warm_started", len(top))
    return len(top)


def worst_values(objectives: Sequence[str], cand: Candidate | None = None) -> list[float]:
    """What an infeasible trial is told: no throughput (and its predicted memory)."""
    out = [0.0]
    for o in objectives[1:]:
        if o == "peak_memory":
            out.append(float((cand.prediction if cand else {}).get("peak_memory_bytes") or 0.0))
        else:
            out.append(0.0)
    return out


def measured_by_key(trials: Sequence[FrozenTrial]) -> dict[str, FrozenTrial]:
    """The first finished measurement of each point (duplicates are told its values)."""
    out: dict[str, FrozenTrial] = {}
    for t in trials:
        if (t.state == TrialState.COMPLETE and t.user_attrs.get(A_OUTCOME) in MEASURED_OUTCOMES
                and A_KEY in t.user_attrs):
            out.setdefault(t.user_attrs[A_KEY], t)
    return out


def settle_without_job(study: optuna.Study, trial_id: int, number: int, cand: Candidate,
                       objectives: Sequence[str], measured: Mapping[str, FrozenTrial],
                       in_flight: set[str], memory_bytes: float) -> bool:
    """Tell a proposal that needs no job (returns True), else leave it to be submitted."""
    storage = study._storage
    set_attr = storage.set_trial_user_attr
    set_attr(trial_id, A_KEY, cand.key)
    if cand.layout is None or cand.reason not in ("", NO_FIT):
        set_attr(trial_id, A_OUTCOME, "invalid")
        set_attr(trial_id, A_REASON, cand.reason)
        constrain(study, trial_id, 1.0)
        study.tell(number, worst_values(objectives, cand), skip_if_finished=True)
        return True
    if cand.reason == NO_FIT:
        peak = float(cand.prediction.get("peak_memory_bytes") or memory_bytes)
        set_attr(trial_id, A_OUTCOME, "predicted_oom")
        set_attr(trial_id, A_REASON, f"predicted peak memory {peak / 1e9:.3g} GB > "
                                     f"{memory_bytes / 1e9:.3g} GB")
        set_attr(trial_id, A_PREDICTION, dict(cand.prediction))
        # How far over: the sampler sees a graded boundary, not only a wall.
        constrain(study, trial_id, max(peak / memory_bytes - 1.0, 1e-6))
        study.tell(number, worst_values(objectives, cand), skip_if_finished=True)
        return True
    same = measured.get(cand.key)
    if same is not None:
        set_attr(trial_id, A_OUTCOME, "duplicate")
        set_attr(trial_id, A_SAME_AS, same.number)
        constrain(study, trial_id, same.user_attrs.get(A_CONSTRAINT, [0.0])[0])
        study.tell(number, list(same.values), skip_if_finished=True)
        return True
    if cand.key in in_flight:
        set_attr(trial_id, A_OUTCOME, "duplicate_in_flight")
        study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
        return True
    return False


@dataclass
class Proposal:
    trial_id: int
    number: int
    candidate: Candidate


def ask_next(study: optuna.Study, cands: Candidates, *, sampler: str, seed: int,
             objectives: Sequence[str], in_flight: set[str], max_asks: int = 50,
             n_startup_trials: int | None = None) -> Proposal | None:
    """The next proposal that needs a measurement, telling the others on the way; None when
    ``max_asks`` proposals in a row needed none (the space is spent, as far as the sampler
    can tell)."""
    dists = cands.distributions
    for _ in range(max_asks):
        trials = study.get_trials(deepcopy=False)
        if sampler == "grid" and len(trials) >= cands.size() and not any(
                t.state == TrialState.WAITING for t in trials):
            return None
        study.sampler = make_sampler(sampler, ask_seed(seed, len(trials)), cands,
                                     n_startup_trials)
        trial = study.ask(dists)
        cand = cands.lookup(trial.params)
        if not settle_without_job(study, trial._trial_id, trial.number, cand, objectives,
                                  measured_by_key(trials), in_flight, cands.memory_bytes):
            study._storage.set_trial_user_attr(trial._trial_id, A_PREDICTION,
                                               dict(cand.prediction))
            return Proposal(trial._trial_id, trial.number, cand)
    return None


def feasible_left(trials: Sequence[FrozenTrial], cands: Candidates) -> int:
    """Points predicted to fit that no finished or running trial covers."""
    covered = {t.user_attrs.get(A_KEY) for t in trials
               if t.state in (TrialState.COMPLETE, TrialState.RUNNING)
               and t.user_attrs.get(A_OUTCOME) not in ("duplicate_in_flight",)}
    return sum(1 for c in cands.feasible() if c.key not in covered)


def best_trial(trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """The feasible measured trial with the highest throughput per GPU."""
    ok = [t for t in trials if t.state == TrialState.COMPLETE
          and t.user_attrs.get(A_OUTCOME) == "measured"
          and all(c <= 0 for c in t.user_attrs.get(A_CONSTRAINT, [0.0]))]
    return max(ok, key=lambda t: (t.values[0], -t.number)) if ok else None
