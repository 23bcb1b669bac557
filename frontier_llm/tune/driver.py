"""The ask/tell loop over real jobs: collect what finished, tell Optuna, ask, submit.

One :func:`step` is idempotent and holds the study's lock (tune.lock) from the first read to the
last write, so two ``flm tune step`` at once (cron on a login node) take turns and never submit
one trial twice. Each trial is a one-layout sweep (``<study>.tNNNN``) submitted through the
sweep machinery (jobs.runner, jobs.state), so it has job rows, SUBMITTING tokens and the same
crash recovery as ``flm sweep``. What a killed driver leaves behind is found again:

- a trial asked but never given a sweep: it is settled or submitted now;
- a trial whose sweep was recorded but not submitted (or died inside sbatch): runner.submit
  adopts or submits it (the job's SLURM comment carries its token);
- a trial whose job ended: its trace is collected into the store and the result told.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import and_, select

from frontier_llm.errors import UserError
from frontier_llm.jobs import runner
from frontier_llm.jobs.executors import Executor, SlurmExecutor
from frontier_llm.jobs.lifecycle import JobState
from frontier_llm.jobs.slurm import SlurmClient
from frontier_llm.jobs.state import SweepJobs
from frontier_llm.jobs.sweepdir import load_manifest, render_sweep
from frontier_llm.specs.identity import layout_hash
from frontier_llm.specs.vocab import RunStatus
from frontier_llm.store import Store
from frontier_llm.store.schema import flm_jobs, flm_layouts, flm_runs, flm_sweeps
from frontier_llm.tune import optuna_study as osx
from frontier_llm.tune.local import DetachedLocalExecutor
from frontier_llm.tune.lock import study_lock
from frontier_llm.tune.space import Candidate
from frontier_llm.tune.spec import StudyFile


@dataclass
class StepReport:
    told: int = 0
    submitted: int = 0
    adopted: int = 0
    running: int = 0
    measured: int = 0  # trials that became jobs, all told
    node_hours: float = 0.0
    finished: bool = False
    why: str = ""
    best: dict[str, Any] | None = None
    outcomes: dict[str, int] = field(default_factory=dict)


class Tuner:
    """One study over one results database."""

    def __init__(self, study: StudyFile, store: Store, url: str, *, out: str | Path | None = None,
                 client: SlurmClient | None = None, executor: str | None = None) -> None:
        self.sf = study
        self.store = store
        self.url = url
        self._storage = None
        self.out = Path(out).resolve() if out else None
        self.executor_name = executor or study.executor
        self.client = client
        self._executor: Executor | None = None

    # --- the study ---------------------------------------------------------------------------
    @property
    def storage(self):
        """Optuna's storage; the first use creates its tables, which two processes must not do
        at once (PostgreSQL refuses the second CREATE TYPE), hence the lock."""
        if self._storage is None:
            with study_lock(self.store, "optuna-schema"):
                self._storage = osx.make_storage(self.url)
        return self._storage

    def open(self) -> optuna.Study:
        """Create or load the study (refusing one of the same name with another space)."""
        directory = str(self.out or (Path("runs") / self.sf.name).resolve())
        study, _ = osx.open_study(
            self.sf.name, self.storage, self.sf.directions, self.sf.identity(),
            {"flm_directory": directory, "flm_source": str(self.sf.source),
             "flm_objectives": list(self.sf.objectives), "flm_sampler": self.sf.section.sampler,
             "flm_seed": self.sf.section.seed, "flm_gpus": self.sf.gpus,
             "flm_nodes_per_trial": self._nodes(),
             "flm_budget": {"trials": self.sf.budget.trials,
                            "node_hours": self.sf.budget.node_hours}},
            self.store.url_redacted)
        stored = study.user_attrs.get("flm_directory")
        if self.out and stored and stored != str(self.out):
            raise UserError(f"study {self.sf.name} keeps its trials in {stored}; use --out "
                            f"{stored} or rename the study")
        self.directory = Path(stored or directory)
        osx.warm_start(study, self.sf.candidates, self.sf.section.warm_start)
        return study

    def tell_sweep_runs(self, sweep: str) -> int:
        """Tell the study the completed runs a sweep already measured of its layouts (same
        layout hash: model, system and layout; same measured steps), as measured trials without
        a job, so that a proposal of one of them is told those values (a duplicate) instead of
        measured again. Only for throughput and peak-memory objectives (a sweep run's
        node-hours are not this study's). Idempotent: a layout the study has measured, or was
        told before, is skipped. Returns how many trials it added."""
        if not set(self.sf.objectives) <= {"throughput_per_gpu", "peak_memory"}:
            return 0
        with self.store.read() as conn:
            rows = [dict(r) for r in conn.execute(
                select(flm_runs, flm_layouts.c.layout_hash)
                .join(flm_layouts, flm_layouts.c.id == flm_runs.c.layout_id)
                .where(and_(flm_runs.c.sweep_name == sweep,
                            flm_runs.c.status == RunStatus.COMPLETED.value,
                            flm_runs.c.steps_measured == self.sf.probe.spec.steps))
                .order_by(flm_runs.c.id)).mappings()]
        first: dict[str, dict[str, Any]] = {}
        for r in rows:
            first.setdefault(r["layout_hash"], r)
        dists = self.sf.candidates.distributions
        added = 0
        self.storage  # noqa: B018 (made before the study's lock: it takes a lock of its own)
        with study_lock(self.store, self.sf.name):
            study = self.open()
            known = osx.measured_by_key(study.get_trials(deepcopy=False))
            for cand in self.sf.candidates.feasible():
                run = first.get(layout_hash(self.sf.model, self.sf.system.name, cand.layout))
                if run is None or cand.key in known:
                    continue
                tput = float(run["tokens_per_s"] or 0.0) / max(1, int(run["world_size"]))
                values = [tput if o == "throughput_per_gpu"
                          else float(run["peak_memory_bytes"] or 0.0) for o in self.sf.objectives]
                template = optuna.trial.create_trial(
                    state=TrialState.RUNNING, distributions=dists,
                    params={k: cand.params[k] for k in dists})
                tid = self.storage.create_new_trial(study._study_id, template_trial=template)
                number = self.storage.get_trial_number_from_id(tid)
                # The layout too, as a submitted trial has it: a told trial can be the best,
                # and flm tune best writes the winner's layout (it was {} without it).
                for key, value in ((osx.A_KEY, cand.key), (osx.A_LAYOUT, cand.layout_entry()),
                                   ("flm_run_id", run["run_id"]),
                                   ("flm_run_row", run["id"]), ("flm_from_sweep", sweep),
                                   (osx.A_PREDICTION, dict(cand.prediction)),
                                   ("flm_measured", {"throughput_per_gpu": tput,
                                                     "tokens_per_s": run["tokens_per_s"],
                                                     "step_time_s": run["step_time_s"],
                                                     "peak_memory_bytes":
                                                         run["peak_memory_bytes"]}),
                                   (osx.A_OUTCOME, "measured")):
                    self.storage.set_trial_user_attr(tid, key, value)
                osx.constrain(study, tid, 0.0)
                study.tell(number, values)
                added += 1
        return added

    @property
    def executor(self) -> Executor:
        if self._executor is None:
            if self.executor_name == "slurm":
                self._executor = SlurmExecutor(self.client)
            elif self.executor_name == "local":
                self._executor = DetachedLocalExecutor()
            else:
                raise UserError(f"executor must be slurm or local (got {self.executor_name!r})")
        return self._executor

    # --- one step ------------------------------------------------------------------------------
    def step(self) -> StepReport:
        report = StepReport()
        self.storage  # noqa: B018 (made before the study's lock: it takes a lock of its own)
        with study_lock(self.store, self.sf.name):
            study = self.open()
            self._collect(study, report)
            self._fill(study, report)
            self._summarise(study, report)
        return report

    def _collect(self, study: optuna.Study, report: StepReport) -> None:
        dists = self.sf.candidates.distributions
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if osx.A_SWEEP not in t.user_attrs and set(t.params) != set(dists):
                # Killed inside study.ask, before every parameter was drawn: nothing was
                # submitted and the proposal cannot be rebuilt.
                study._storage.set_trial_user_attr(t._trial_id, osx.A_OUTCOME, "interrupted")
                study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
                report.told += 1
                continue
            cand = self.sf.candidates.lookup(t.params)
            if osx.A_SWEEP not in t.user_attrs:
                # Asked by a driver that died before submitting: finish its work now.
                running = self._in_flight_keys(study, exclude=t.number)
                if osx.settle_without_job(study, t._trial_id, t.number, cand, self.sf.objectives,
                                          osx.measured_by_key(study.get_trials(deepcopy=False)),
                                          running, self.sf.candidates.memory_bytes):
                    report.told += 1
                    continue
                self._submit(study, t._trial_id, t.number, cand)
                report.adopted += 1
                continue
            session = self._session(t.number, cand)
            rows = session.state.rows()
            if any(r["state"] in (JobState.RENDERED, JobState.SUBMITTING) for r in rows):
                counts = runner.submit(session)
                report.adopted += counts["adopted"] + counts["submitted"]
            rows = runner.refresh(session)
            row = rows[0]
            if JobState(row["state"]).terminal:
                self._tell_job(study, t, session, row)
                report.told += 1

    def _fill(self, study: optuna.Study, report: StepReport) -> None:
        sec = self.sf.section
        while True:
            trials = study.get_trials(deepcopy=False)
            running = [t for t in trials if t.state == TrialState.RUNNING]
            if len(running) >= sec.in_flight:
                return
            why = self._budget_spent(trials)
            if why:
                report.why = why
                return
            if not osx.feasible_left(trials, self.sf.candidates):
                report.why = "every layout predicted to fit has been tried"
                return
            p = osx.ask_next(study, self.sf.candidates, sampler=sec.sampler, seed=sec.seed,
                             objectives=self.sf.objectives,
                             in_flight=self._in_flight_keys(study))
            if p is None:
                report.why = "the sampler proposes nothing new"
                return
            self._submit(study, p.trial_id, p.number, p.candidate)
            report.submitted += 1

    def _budget_spent(self, trials: list[FrozenTrial]) -> str:
        b = self.sf.budget
        jobs = [t for t in trials if osx.A_SWEEP in t.user_attrs]
        if b.trials is not None and len(jobs) >= b.trials:
            return f"budget of {b.trials} trials spent"
        if b.node_hours is not None and self._node_hours(trials) >= b.node_hours:
            return f"budget of {b.node_hours:g} node-hours spent"
        return ""

    def _node_hours(self, trials: list[FrozenTrial]) -> float:
        """Node-hours of finished trials plus what running ones have used so far."""
        used = sum(float(t.user_attrs.get("flm_node_hours") or 0.0) for t in trials)
        live = [t.user_attrs[osx.A_SWEEP] for t in trials
                if t.state == TrialState.RUNNING and osx.A_SWEEP in t.user_attrs]
        if live:
            now = datetime.now(UTC)
            with self.store.read() as conn:
                rows = conn.execute(select(flm_jobs.c.started_at, flm_jobs.c.submitted_at)
                                    .join(flm_sweeps, flm_sweeps.c.id == flm_jobs.c.sweep_id)
                                    .where(flm_sweeps.c.name.in_(live))).all()
            nodes = self._nodes()
            for started, _submitted in rows:
                if started is not None:
                    used += max(0.0, (now - _aware(started)).total_seconds()) * nodes / 3600
        return used

    def _nodes(self) -> int:
        per_node = self.sf.probe.spec.gpus_per_node or self.sf.system.gpus_per_node
        return max(1, -(-self.sf.gpus // per_node))

    def _in_flight_keys(self, study: optuna.Study, exclude: int | None = None) -> set[str]:
        return {t.user_attrs.get(osx.A_KEY) for t in study.get_trials(
            deepcopy=False, states=(TrialState.RUNNING,))
            if t.number != exclude and osx.A_SWEEP in t.user_attrs}

    # --- jobs ----------------------------------------------------------------------------------
    def _trial_dir(self, number: int) -> Path:
        return self.directory / f"t{number:04d}"

    def _submit(self, study: optuna.Study, trial_id: int, number: int, cand: Candidate) -> None:
        """Record the trial's sweep first, then render, open its job row and submit: a crash
        anywhere in between is resumed by the next step (runner.submit's token)."""
        storage = study._storage
        entry = cand.layout_entry()
        storage.set_trial_user_attr(trial_id, osx.A_KEY, cand.key)
        storage.set_trial_user_attr(trial_id, osx.A_LAYOUT, entry)
        storage.set_trial_user_attr(trial_id, osx.A_SWEEP, self.sf.trial_name(number))
        session = self._session(number, cand)
        runner.submit(session)
        row = session.state.rows()[0]
        storage.set_trial_user_attr(trial_id, "flm_job_key", row["job_key"])
        storage.set_trial_user_attr(trial_id, "flm_job_row", self._job_row_id(session))
        if row.get("run_id"):
            storage.set_trial_user_attr(trial_id, "flm_run_id", row["run_id"])

    def _session(self, number: int, cand: Candidate) -> runner.Session:
        name = self.sf.trial_name(number)
        directory = self._trial_dir(number)
        try:
            state = SweepJobs.find(self.store, name)
            manifest = load_manifest(state.directory)
        except UserError:
            sweep = self.sf.trial_sweep(number, cand.layout_entry())
            manifest = render_sweep(sweep, directory)
            state = SweepJobs.open(self.store, manifest, sweep.text)
        return runner.Session(manifest, state, self.executor)

    def _job_row_id(self, session: runner.Session) -> int | None:
        with self.store.read() as conn:
            return conn.execute(select(flm_jobs.c.id).where(
                flm_jobs.c.sweep_id == session.state.sweep_id)).scalar()

    def _tell_job(self, study: optuna.Study, t: FrozenTrial, session: runner.Session,
                  row: dict[str, Any]) -> None:
        from frontier_llm.store.ingest import collect

        storage, tid = study._storage, t._trial_id
        verdict = JobState(row["state"])
        storage.set_trial_user_attr(tid, osx.A_CLASSIFICATION, verdict.value)
        if row.get("reason"):
            storage.set_trial_user_attr(tid, osx.A_REASON, str(row["reason"])[:500])
        if row.get("run_id"):
            storage.set_trial_user_attr(tid, "flm_run_id", row["run_id"])
        storage.set_trial_user_attr(tid, "flm_job_row", self._job_row_id(session))
        hours = _hours(row) * self._nodes()
        storage.set_trial_user_attr(tid, "flm_node_hours", hours)
        objectives = self.sf.objectives
        if verdict == JobState.COMPLETED:
            collect(self.store, [session.manifest.trace_dir])
            runner.link_layouts(session)
            run = self._run_row(row.get("run_id"))
            if run is None:
                storage.set_trial_user_attr(tid, osx.A_OUTCOME, "failed")
                storage.set_trial_user_attr(tid, osx.A_REASON, "completed but no run stored")
                study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
                return
            storage.set_trial_user_attr(tid, "flm_run_row", run["id"])
            tput = float(run["tokens_per_s"] or 0.0) / max(1, int(run["world_size"]))
            values = [tput]
            for o in objectives[1:]:
                values.append(float(run["peak_memory_bytes"] or 0.0) if o == "peak_memory"
                              else hours)
            storage.set_trial_user_attr(tid, "flm_measured", {
                "throughput_per_gpu": tput, "tokens_per_s": run["tokens_per_s"],
                "step_time_s": run["step_time_s"], "peak_memory_bytes": run["peak_memory_bytes"],
                "mfu": run["mfu"]})
            storage.set_trial_user_attr(tid, osx.A_OUTCOME, "measured")
            osx.constrain(study, tid, 0.0)
            study.tell(t.number, values, skip_if_finished=True)
        elif verdict in (JobState.OOM, JobState.TIMEOUT):
            # The layout itself is the problem: a constraint the sampler learns, not noise.
            storage.set_trial_user_attr(tid, osx.A_OUTCOME, verdict.value.lower())
            osx.constrain(study, tid, 1.0)
            study.tell(t.number, osx.worst_values(objectives, self.sf.candidates.lookup(
                t.params)), skip_if_finished=True)
        else:
            storage.set_trial_user_attr(tid, osx.A_OUTCOME, "failed")
            study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)

    def _run_row(self, run_id: str | None) -> dict[str, Any] | None:
        if not run_id:
            return None
        with self.store.read() as conn:
            row = conn.execute(select(flm_runs).where(and_(
                flm_runs.c.run_id == run_id))).mappings().first()
        return dict(row) if row else None

    def _summarise(self, study: optuna.Study, report: StepReport) -> None:
        trials = study.get_trials(deepcopy=False)
        report.running = sum(t.state == TrialState.RUNNING for t in trials)
        report.measured = sum(osx.A_SWEEP in t.user_attrs and t.state != TrialState.RUNNING
                              for t in trials)
        report.node_hours = self._node_hours(trials)
        report.outcomes = dict(Counter(t.user_attrs.get(osx.A_OUTCOME, t.state.name.lower())
                                       for t in trials))
        best = osx.best_trial(trials)
        if best is not None:
            report.best = {"number": best.number, "throughput_per_gpu": best.values[0],
                           "params": dict(best.params)}
        report.finished = report.running == 0 and bool(report.why)

    # --- the long-lived driver -------------------------------------------------------------------
    def run(self, *, poll_s: float = 5.0, timeout_s: float | None = None,
            on_step=None) -> StepReport:
        """Step until the study is finished (budget spent or space exhausted) or the timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            report = self.step()
            if on_step:
                on_step(report)
            if report.finished:
                return report
            if deadline is not None and time.monotonic() > deadline:
                return report
            time.sleep(poll_s)


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _hours(row: dict[str, Any]) -> float:
    start = row.get("started_at") or row.get("submitted_at")
    end = row.get("finished_at")
    if not start or not end:
        return 0.0
    return max(0.0, (_aware(end) - _aware(start)).total_seconds()) / 3600
