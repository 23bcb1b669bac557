"""The quickstart's stages, each a call into the stage's own API: flm calibrate's microbenchmarks
and refit from runs (calibrate, through quickstart.calibration), the planner (choose), the sweep
runner with the local executor and the collector (jobs, store), the Optuna driver (tune) and the
reports (report). Nothing here measures or predicts by itself.

Resumable by construction: the sweep's job rows and the study's trials live in the folder's
SQLite database, written as things happen (each write one transaction), so Ctrl-C leaves it
consistent; a second run skips every completed job and told trial and finishes the rest.
- sweep: jobs that completed (or failed) keep their verdict and are not run again; the job that
  Ctrl-C stopped is recorded CANCELLED by the local executor and is run again, under a new run
  id; a job left RUNNING by a killed process is observed (alive or ended, by its trace) first.
- calibration: each system file is written atomically, last; one that exists is reused.
- study: ``flm tune``'s step is idempotent (docs/tune.md); a trial whose job was running when
  the driver stopped is collected by the next step, not submitted again.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from frontier_llm.catalog import load_system
from frontier_llm.errors import UserError
from frontier_llm.jobs import runner
from frontier_llm.jobs.lifecycle import JobState
from frontier_llm.jobs.sweepspec import load_sweep
from frontier_llm.quickstart import calibration
from frontier_llm.quickstart.choose import Choice, choose
from frontier_llm.quickstart.files import STUDY_NAME, SWEEP_NAME, study_text, sweep_text
from frontier_llm.quickstart.settings import Settings, claim
from frontier_llm.specs.axes import frame_world_size
from frontier_llm.specs.forms import row_label
from frontier_llm.store import open_store

# Update a bar: (done, total, what is happening).
Update = Callable[[int, "int | None", "str | None"], None]


class Bar(Protocol):
    def update(self, done: int, total: int | None = None, description: str | None = None
               ) -> None: ...

    def log(self, line: str) -> None: ...


class Reporter(Protocol):
    """Where the stages speak: ``say`` a line; ``bar`` a progress bar for a long step (the CLI
    draws rich bars at a terminal and nothing elsewhere)."""

    def say(self, line: str = "") -> None: ...

    def bar(self, description: str) -> contextlib.AbstractContextManager[Bar]: ...


class _NoBar:
    def update(self, done: int, total: int | None = None, description: str | None = None
               ) -> None:
        pass

    def log(self, line: str) -> None:
        print(line)


class PlainReporter:
    """Lines on stdout, no bars (tests, scripts)."""

    def say(self, line: str = "") -> None:
        print(line)

    @contextlib.contextmanager
    def bar(self, description: str) -> Iterator[Bar]:
        yield _NoBar()


@dataclass
class QuickstartResult:
    """What a run did and where it put things."""

    out: Path
    db_url: str
    resumed: bool
    plan_csv: Path
    sweep_file: Path
    study_file: Path
    sweep_dir: Path
    study_dir: Path
    reports_dir: Path
    jobs: dict[str, int] = field(default_factory=dict)  # final job states, counted
    ran_now: list[str] = field(default_factory=list)  # job keys run by this invocation
    study: dict[str, Any] = field(default_factory=dict)  # flm tune status of the study
    reports: list[Path] = field(default_factory=list)
    skipped_reports: dict[str, str] = field(default_factory=dict)  # report -> why not
    seconds: dict[str, float] = field(default_factory=dict)  # wall time of each stage
    # The system files that predicted, by role (built-in, microbench, refit): the errors
    # report compares them on the same runs.
    systems: dict[str, Path] = field(default_factory=dict)
    # Step time MAPE (%) and rank correlation of throughput per rank, by (runs, system role).
    scores: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    # The calibration the study predicts with: the lower held-out error (calibration.py).
    kept: str = "microbench"


class Quickstart:
    """``Quickstart(settings, reporter).run()``: plan, sweep, collect, tune, report."""

    def __init__(self, settings: Settings, reporter: Reporter | None = None) -> None:
        self.s = settings
        self.r = reporter or PlainReporter()
        out = settings.out
        self.result = QuickstartResult(
            out=out, db_url=settings.db_url, resumed=False, plan_csv=out / "plan.csv",
            sweep_file=out / "quickstart-sweep.yaml", study_file=out / "quickstart-study.yaml",
            sweep_dir=out / "sweep", study_dir=out / "study", reports_dir=out / "reports")

    def run(self) -> QuickstartResult:
        with claim(self.s) as new:
            self.result.resumed = not new
            if self.result.resumed:
                self.r.say(f"resuming the quickstart in {self.s.out} (done work is kept)")
                self._upgrade_database()
            self.result.systems = {"built-in": self.s.system_file}
            self._timed("calibrate", self.calibrate)
            choice = self._timed("plan", self.plan)
            self._timed("sweep", self.sweep, choice)
            self._timed("refit", self.refit)
            self._timed("study", self.tune)
            self._timed("reports", self.report, choice)
        return self.result

    def _upgrade_database(self) -> None:
        """The folder's database is the quickstart's own: one made by an older frontier_llm is
        migrated (as 'flm db upgrade' would) rather than refused, so a resume after an update
        of the package goes on."""
        if not self.s.db_path.is_file():
            return
        store = open_store(self.result.db_url, check=False)
        try:
            ran = store.upgrade()
        finally:
            store.close()
        if ran:
            self.r.say(f"   upgraded {self.s.db_path} to schema version {ran[-1]}")

    def _timed(self, stage: str, fn: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        value = fn(*args)
        self.result.seconds[stage] = seconds = time.perf_counter() - start
        self.r.say(f"   ({stage}: {seconds:.0f} s)")
        return value

    def _predicting(self, *roles: str) -> str:
        """The system that predicts: the file of the latest of ``roles`` this run has (an
        absolute path, since the sweep and study files that name it are read elsewhere), else
        the settings' system as given (a catalog name stays a name)."""
        for role in reversed(roles):
            if role in self.result.systems:
                return str(self.result.systems[role].resolve())
        return self.s.system

    # --- 1. calibrate ----------------------------------------------------------------------------
    def calibrate(self) -> None:
        s = self.s
        if not s.calibrate:
            self.r.say(f"1. calibrate: skipped (--no-calibrate): {s.system} predicts as it is")
            return
        files = calibration.Files(s.calibration_dir)
        if self.result.sweep_file.is_file() and not files.microbench.is_file():
            # The sweep file names the calibration that planned it: a folder whose sweep was
            # written without one is another version's, and measuring first would be wasted.
            raise UserError(f"{self.result.sweep_file} was written by another version of flm "
                            "quickstart (one that did not calibrate); give another --out to "
                            "start afresh")
        self.r.say(f"1. calibrate: flm calibrate's microbenchmarks on {s.ranks} ranks here "
                   f"(block GEMMs of {s.model}, gloo collectives), fitted into {s.system}")
        with self.r.bar("calibrate") as bar:
            # Rank 0's steps: the GEMMs, then each collective of each group shape.
            steps = 1 + 2 * 4
            done = [0]

            def progress(line: str) -> None:
                done[0] += 1
                bar.update(min(done[0], steps), steps, f"calibrate: {line}")

            path, what = calibration.microbench(s, files, self.result.db_url, progress)
        self.result.systems["microbench"] = path
        self.r.say(f"   {_shown(path)}: {what}")

    # --- 2. plan -------------------------------------------------------------------------------
    def plan(self) -> Choice:
        s = self.s
        system = self._predicting("microbench")
        choice = choose(s, system)
        choice.ranked.to_csv(self.result.plan_csv, index=False)
        self.r.say(f"2. plan: {s.model} on {s.ranks} CPU ranks, global batch "
                   f"{s.global_batch}: {len(choice.plan.reason)} layouts evaluated, "
                   f"{len(choice.ranked)} valid and predicted to fit")
        self.r.say(f"   predicted with {_shown(Path(system)) if system != s.system else system}"
                   + (" (calibrated here)" if "microbench" in self.result.systems else
                      " (not calibrated on this machine)"))
        self.r.say(plan_table(choice, top=8))
        self.r.say(f"   measuring the {len(choice.layouts)} marked * (the fastest predicted of "
                   "each TP x PP shape)"
                   + (f" and {len(choice.scaling)} smaller points of the first data-parallel "
                      "one (weak scaling)" if choice.scaling else ""))
        return choice

    # --- 2. sweep and collect ------------------------------------------------------------------
    def sweep(self, choice: Choice) -> None:
        from frontier_llm.store.ingest import collect

        res = self.result
        text = sweep_text(self.s, [*choice.scaling, *choice.layouts],
                          self._predicting("microbench"))
        _write_once(res.sweep_file, text)
        sweep = load_sweep(res.sweep_file)
        store = open_store(res.db_url)
        try:
            session = runner.prepare(sweep, res.sweep_dir.resolve(), store, executor="local")
            rows = _settle_leftovers(session)
            before = {r["job_key"]: r["run_id"] for r in rows}
            todo = [r["job_key"] for r in rows
                    if r["state"] in (JobState.RENDERED, JobState.SUBMITTING)]
            self.r.say(f"3. sweep: {len(rows)} jobs (real flm bench runs, one at a time): "
                       f"{len(todo)} to run, {len(rows) - len(todo)} done before")
            with self.r.bar("sweep") as bar:
                def watch(current: list[dict[str, Any]]) -> None:
                    ended = sum(JobState(r["state"]).terminal for r in current)
                    # Jobs waiting their turn here are SUBMITTING to the jobs layer.
                    text = runner.summary(current).replace(JobState.SUBMITTING, "queued")
                    bar.update(ended, len(current), f"sweep: {text}")

                session.watch = watch
                try:
                    runner.submit(session, todo, max_in_flight=1)
                finally:
                    session.watch = None
            report = collect(store, [session.manifest.trace_dir])
            runner.link_layouts(session)
            rows = session.state.rows()
        finally:
            store.close()
        res.ran_now = [r["job_key"] for r in rows if r["run_id"] != before.get(r["job_key"])]
        res.jobs = dict(pd.Series([r["state"] for r in rows]).value_counts())
        self.r.say(f"   {runner.summary(rows)}; traces stored: {report.inserted} new "
                   f"({res.db_url})")
        for r in rows:
            if r["state"] != JobState.COMPLETED:
                self.r.say(f"   {r['job_key']}: {r['state']} {r['reason'] or ''}".rstrip())

    # --- 4. refit --------------------------------------------------------------------------------
    def refit(self) -> None:
        s = self.s
        if not s.calibrate:
            self.r.say("4. refit: skipped (--no-calibrate)")
            return
        files = calibration.Files(s.calibration_dir)
        self.r.say(f"4. refit: flm calibrate --from-runs on the sweep's runs (knobs "
                   f"{', '.join(calibration.REFIT_KNOBS)}, from the microbenchmark file)")
        with self.r.bar("refit") as bar:
            bar.update(0, None, "refit: fitting, with k-fold cross-validation")
            fit = calibration.refit(s, files, self.result.db_url, SWEEP_NAME)
        if fit.file is None:
            self.r.say(f"   no refit: {fit.why}; the study predicts with the microbenchmark "
                       "file")
            return
        self.result.systems["refit"] = fit.file
        knobs = ", ".join(calibration.knob_text(k, v) for k, v in fit.knobs.items())
        self.r.say(f"   {_shown(fit.file)}: {knobs}")
        self.r.say(f"   step time against the sweep's {len(fit.per_run)} layouts: MAPE, rank "
                   "correlation of predicted and measured throughput per rank")
        for what, mape, rho in calibration.sweep_scores(s, fit):
            self.result.scores[("sweep", what)] = (mape, rho)
            self.r.say(f"     {what:<34} {mape:6.1f} %   {rho:+.2f}")
        self.result.kept, why = calibration.kept_calibration(fit)
        self.r.say(f"   {why}; the study predicts with "
                   f"{_shown(self.result.systems[self.result.kept])}")

    # --- 5. study --------------------------------------------------------------------------------
    def tune(self) -> None:
        from frontier_llm.tune import optuna_study as osx
        from frontier_llm.tune import report as tune_report
        from frontier_llm.tune.driver import Tuner
        from frontier_llm.tune.spec import load_study

        res = self.result
        _write_once(res.study_file,
                    study_text(self.s, self._predicting(res.kept)))
        study = load_study(res.study_file)
        store = open_store(res.db_url)
        try:
            tuner = Tuner(study, store, res.db_url, out=res.study_dir.resolve(),
                          executor="local")
            self.r.say(f"5. study: Optuna ({study.section.sampler}), {self.s.trials} trials, "
                       f"the first {study.section.warm_start} the layouts the model predicts "
                       "fastest; proposals it predicts not to fit, or already measured, cost "
                       "no job")
            # The sweep measured some of the study's layouts: told as measured trials, the
            # study's jobs go to layouts nobody has measured yet.
            told = tuner.tell_sweep_runs(SWEEP_NAME)
            if told:
                self.r.say(f"   told the study the {told} layouts the sweep measured")
            with self.r.bar("study") as bar:
                def show(step) -> None:
                    best = (f"best {step.best['throughput_per_gpu']:,.1f} tokens/s per rank"
                            if step.best else "no result yet")
                    bar.update(step.measured, self.s.trials,
                               f"study: {step.measured} done, {step.running} running, {best}")

                tuner.run(poll_s=1.0, on_step=show)
        finally:
            store.close()
        status = tune_report.status(tune_report.load(STUDY_NAME, osx.make_storage(res.db_url)))
        res.study = status
        for line in tune_report.status_lines(status):
            self.r.say(f"   {line}")

    # --- 6. reports -----------------------------------------------------------------------------
    def report(self, choice: Choice) -> None:
        from frontier_llm.report.render import errors_report, layouts_report, scaling_report
        from frontier_llm.report.sources import rank_memory, sweep_report_frame, validation_runs

        res = self.result
        out = res.reports_dir
        out.mkdir(parents=True, exist_ok=True)
        db = res.db_url
        self.r.say(f"6. reports: measured beside predicted ({out})")

        def scaling() -> list[Path]:
            if not choice.scaling:
                raise UserError("no layout with data parallelism was chosen: no scaling series")
            frame, _ = sweep_report_frame(SWEEP_NAME, db)
            base = choice.scaling[0]
            mask = ((frame["tp"] == base.tp) & (frame["pp"] == base.pp)
                    & (frame["micro_batch"] == base.micro_batch)
                    & (frame["sharding"] == f"zero{base.zero_stage}"))
            _, paths = scaling_report(frame[mask], out, f"{SWEEP_NAME}-scaling", source="both",
                                      mode="weak", gpu_label="ranks")
            return paths

        def layouts() -> list[Path]:
            # The full-size layouts only: the scaling series' smaller runs are the scaling
            # report's, and bars of 1, 2 and 4 ranks side by side would compare unlike things.
            frame, _ = sweep_report_frame(SWEEP_NAME, db)
            frame = frame[frame["world_size"] == self.s.ranks]
            title = (f"{self.s.model} on {self.s.ranks} CPU ranks: the fastest predicted "
                     "layout of each TP x PP shape"
                     + ("\npredicted by the microbenchmark-calibrated file that chose them"
                        if "microbench" in res.systems else ""))
            table, paths = layouts_report(frame, out, f"{SWEEP_NAME}-layouts",
                                          rank_memory=rank_memory(db, SWEEP_NAME), title=title,
                                          per="rank", log=True)
            verdicts.append(ranking_line(table))
            return paths

        def errors() -> list[Path]:
            # Every run, predicted by each system file this run has (built-in, microbenchmark,
            # refit): one group each in the errors report.
            labels = {role: f"{role}: {load_system(str(path)).name}"
                      for role, path in res.systems.items()}
            frame = calibration.three_systems(validation_runs(db, None), db,
                                              [(labels[r], str(p))
                                               for r, p in res.systems.items()])
            title = (f"{self.s.model}: every run predicted by each system file"
                     + (" (peak memory: the same for each)" if len(res.systems) > 1 else ""))
            table, paths = errors_report(frame, out, f"{SWEEP_NAME}-errors", overall=False,
                                         title=title)
            verdicts.append(f"cost model against all {int(table['runs'].iloc[0])} runs (sweep "
                            "and study): step time MAPE, bias, rank correlation of predicted "
                            "and measured throughput per rank")
            for role in res.systems:
                row = table[table["system"] == labels[role]].iloc[0]
                mape, rho = float(row["step_time_mape_pct"]), float(row["throughput_rank_corr"])
                res.scores[("all", role)] = (mape, rho)
                verdicts.append(f"  {labels[role]:<40} {mape:6.1f} %  "
                                f"{float(row['step_time_bias_pct']):+6.1f} %  {rho:+.2f}")
            if "refit" in res.systems:
                # The study's runs: chosen and predicted after the refit, never fitted on.
                study = frame[(frame["system"] == labels["refit"])
                              & (frame["sweep_name"] != SWEEP_NAME)]
                if len(study):
                    mape, rho = calibration.score(
                        study["measured_step_time_s"], study["predicted_step_time_s"],
                        study["global_batch"] / frame_world_size(study))
                    res.scores[("study", "refit")] = (mape, rho)
                    verdicts.append(f"  refit on the study's {len(study)} runs alone (never "
                                    f"fitted on): step time MAPE {mape:.1f} %")
            mem = table["memory_mape_pct"].iloc[-1]
            verdicts.append(f"  peak memory MAPE {mem:.2g} %"
                            + (" (the same for each: the calibrations change rates, not bytes)"
                               if len(res.systems) > 1 else ""))
            return paths

        verdicts: list[str] = []
        steps = {"scaling": scaling, "layouts": layouts, "errors": errors}
        with self.r.bar("reports") as bar:
            for i, (name, make) in enumerate(steps.items()):
                bar.update(i, len(steps), f"reports: {name}")
                try:
                    res.reports += make()
                except UserError as exc:
                    # One report that has nothing to show must not hide the others.
                    res.skipped_reports[name] = str(exc)
            bar.update(len(steps), len(steps), "reports")
        for line in verdicts:
            self.r.say(f"   {line}")
        for name, why in res.skipped_reports.items():
            print(f"flm quickstart: {name} report not written: {why}", file=sys.stderr)


def _shown(path: Path) -> str:
    """A path relative to the working folder when it is under it (shorter), else absolute."""
    path = path.resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _settle_leftovers(session: runner.Session) -> list[dict[str, Any]]:
    """Before running anything: observe jobs an earlier run left live (a killed driver) and
    wait for them, and make the jobs Ctrl-C stopped (CANCELLED) runnable again. Completed and
    failed jobs keep their verdict: nothing measured is measured twice. Jobs an interrupted
    run had queued but not started are still SUBMITTING: runner.submit finds no process of
    theirs and runs them (its crash recovery)."""
    rows = runner.refresh(session)
    if any(JobState(r["state"]).active for r in rows):
        rows = runner.wait(session, timeout_s=600.0, max_interval_s=2.0)
    stopped = [r["job_key"] for r in rows if r["state"] == JobState.CANCELLED]
    if stopped:
        session.state.record([{"k": k, "state": JobState.RENDERED,
                               "reason": "interrupted; run again"} for k in stopped])
        rows = session.state.rows()
    return rows


def _write_once(path: Path, text: str) -> None:
    """Write the stage's file; on a resume it must be the same file, since flm sweep and flm
    tune tie a sweep's or study's name to its file. It differs when the folder was made by
    another version of frontier_llm (a changed plan or file format): refuse, with the way out."""
    if not path.is_file():
        path.write_text(text)
    elif path.read_text() != text:
        raise UserError(f"{path} was written by another version of flm quickstart (this one "
                        "would write a different file, and the jobs recorded for it would "
                        "not match); give another --out to start afresh")


def plan_table(choice: Choice, top: int = 8) -> str:
    """The plan's fastest layouts with their predictions; the measured ones marked *."""
    ranked = choice.ranked.head(max(top, 1))
    chosen = {row_label(r) for _, r in choice.chosen.iterrows()}
    shown = pd.concat([ranked, choice.chosen[choice.chosen["rank"] > top]])
    rows = [{"": "*" if row_label(r) in chosen else " ", "rank": r["rank"],
             "layout": row_label(r), "step_ms": round(r["step_time_s"] * 1e3, 2),
             "tokens/s": round(r["tokens_per_s"]),
             "mem_MB": round(r["peak_memory_bytes"] / 1e6, 1)} for _, r in shown.iterrows()]
    text = pd.DataFrame(rows).to_string(index=False)
    return "\n".join("   " + line for line in text.splitlines())


def ranking_line(table: pd.DataFrame) -> str:
    """Whether the model ranks the measured layouts as they measured: fastest first."""
    done = table.dropna(subset=["tokens_per_s_per_gpu", "predicted_tokens_per_s_per_gpu"])
    if len(done) < 2:
        return "fewer than two layouts measured: no ranking to compare"
    measured = list(done.sort_values("tokens_per_s_per_gpu", ascending=False)["layout"])
    predicted = list(done.sort_values("predicted_tokens_per_s_per_gpu",
                                      ascending=False)["layout"])
    rho = done["tokens_per_s_per_gpu"].rank().corr(done["predicted_tokens_per_s_per_gpu"].rank())
    return (f"fastest measured: {measured[0]} (the model's #{predicted.index(measured[0]) + 1} "
            f"of {len(done)}); rank correlation of predicted and measured throughput "
            f"{rho:+.2f}")
