"""flm tune run|step|status|best: Optuna studies whose trials are real jobs (docs/tune.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from frontier_llm.cli.common import add_command, db_parent, emit_json
from frontier_llm.cli.numbers import seconds


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "tune", "search layouts and run settings with Optuna, one job per trial",
        "A study file is a sweep file with a 'study:' section (space, objective, budget, "
        "sampler, seed). Each trial runs flm bench as a job (SLURM or local); finished traces "
        "go into the results database and their throughput is told to Optuna, whose study "
        "lives in the same database. Layouts the cost model predicts not to fit are never "
        "submitted (they are told as infeasible), and the study starts from the layouts it "
        "predicts fastest.",
        ["flm tune run sweeps/studies/tiny-tune.yaml",
         "flm tune step sweeps/studies/tiny-tune.yaml   # from cron: collect, tell, ask, submit",
         "flm tune status tiny-tune", "flm tune best tiny-tune --format yaml"],
    )
    actions = p.add_subparsers(dest="tune_command", metavar="ACTION")
    db = db_parent()

    def study_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("study", metavar="STUDY.yaml", help="the study file")
        q.add_argument("--out", default=None, metavar="DIR",
                       help="folder of the trials' jobs (default runs/NAME; fixed at creation)")
        q.add_argument("--executor", choices=("slurm", "local"), default=None,
                       help="override the file's executor")

    r = add_command(actions, "run", "drive the study until its budget is spent",
                    "Step (collect, tell, ask, submit) every --poll seconds until the budget "
                    "is spent or nothing is left to try, showing trials done, running and the "
                    "best so far. Interrupted or killed, run (or step) it again: it resumes.",
                    ["flm tune run sweeps/studies/tiny-tune.yaml --poll 10"], parents=[db])
    study_args(r)
    r.add_argument("--poll", type=seconds, default=5.0, metavar="S",
                   help="seconds between steps (default 5)")
    r.add_argument("--timeout", type=seconds, default=None, metavar="S",
                   help="stop driving after S seconds (the jobs keep running)")
    r.set_defaults(func=_run)

    s = add_command(actions, "step", "one idempotent step: collect, tell, ask, submit",
                    "Collect the trials whose jobs ended, tell Optuna, ask for new trials up to "
                    "in_flight and the budget, submit them, and exit. Safe from cron: two steps "
                    "at once take turns on the study's lock and never submit a trial twice.",
                    ["*/5 * * * * cd /proj && "
                     "flm tune step sweeps/studies/tiny-tune.yaml --db $DB"],
                    parents=[db])
    study_args(s)
    s.set_defaults(func=_step)

    st = add_command(actions, "status", "best so far, trials by state, node-hours",
                     "Read the study from the database: trials by state and outcome, node-hours "
                     "used, the best trial and how its measurement compares with the model's "
                     "prediction.",
                     ["flm tune status tiny-tune", "flm tune status sweeps/studies/tiny-tune.yaml "
                      "--format json"], parents=[db])
    st.add_argument("study", metavar="STUDY", help="the study's name or its file")
    st.add_argument("--format", choices=("text", "json", "trials"), default="text",
                    help="text (default), json, or trials (one row per trial)")
    st.set_defaults(func=_status)

    b = add_command(actions, "best", "the winner as a layout for a sweep or a job script",
                    "The best measured trial: its layout as a sweep's layouts: entry, its run "
                    "settings as bench_args, and the flm bench arguments of a production run.",
                    ["flm tune best tiny-tune --format yaml > best.yaml"], parents=[db])
    b.add_argument("study", metavar="STUDY", help="the study's name or its file")
    b.add_argument("--format", choices=("yaml", "json"), default="yaml")
    b.set_defaults(func=_best)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _open(args, *, existing: bool = False):
    """The results database and its URL; ``existing``: a read (status, best), which must not
    create a database at a mistyped path."""
    from frontier_llm.store import open_existing, open_store
    from frontier_llm.store.url import resolve_url

    url = resolve_url(args.db)
    return (open_existing if existing else open_store)(args.db), url


def _tuner(args):
    from frontier_llm.tune.driver import Tuner
    from frontier_llm.tune.spec import load_study

    study = load_study(args.study)
    store, url = _open(args)
    return Tuner(study, store, url, out=args.out, executor=args.executor), store


def _line(report) -> str:
    best = (f"best {report.best['throughput_per_gpu']:,.1f} tokens/s/GPU (trial "
            f"{report.best['number']})" if report.best else "best: none yet")
    return (f"{report.measured} done, {report.running} running, {report.submitted} submitted "
            f"this step, {report.node_hours:.3g} node-hours; {best}"
            + (f"; finished: {report.why}" if report.finished else ""))


def _step(args) -> int:
    tuner, store = _tuner(args)
    try:
        report = tuner.step()
    finally:
        store.close()
    print(f"study {tuner.sf.name}: {_line(report)}")
    return 0


def _run(args) -> int:
    tuner, store = _tuner(args)
    budget = tuner.sf.budget.trials
    try:
        if sys.stdout.isatty():
            from rich.progress import BarColumn, Progress, TextColumn

            with Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                          TextColumn("{task.fields[info]}")) as bar:
                task = bar.add_task(tuner.sf.name, total=budget, info="starting")

                def show(report) -> None:
                    bar.update(task, completed=report.measured, info=_line(report))

                report = tuner.run(poll_s=args.poll, timeout_s=args.timeout, on_step=show)
        else:
            report = tuner.run(poll_s=args.poll, timeout_s=args.timeout)
    finally:
        store.close()
    print(f"study {tuner.sf.name}: {_line(report)}")
    return 0


def _study_name(target: str) -> str:
    if Path(target).suffix in (".yaml", ".yml") and Path(target).is_file():
        from frontier_llm.specs.yamlio import load_yaml

        data = load_yaml(target)
        study = data.get("study") or {}
        return str(study.get("name") or data.get("name"))
    return target


def _load(args):
    from frontier_llm.tune import optuna_study as osx
    from frontier_llm.tune import report

    store, url = _open(args, existing=True)
    try:
        # A study is never created here: the storage only reads what steps wrote.
        return report.load(_study_name(args.study), osx.make_storage(url))
    finally:
        store.close()


def _status(args) -> int:
    import pandas as pd

    from frontier_llm.cli.common import emit_frame
    from frontier_llm.tune import report

    study = _load(args)
    if args.format == "trials":
        emit_frame(pd.DataFrame(report.trial_states(study)), "table")
        return 0
    s = report.status(study)
    if args.format == "json":
        emit_json(s)
    else:
        print("\n".join(report.status_lines(s)))
    return 0


def _best(args) -> int:
    import yaml

    from frontier_llm.tune import report

    doc = report.best_document(_load(args))
    if args.format == "json":
        emit_json(doc)
    else:
        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False))
    return 0
