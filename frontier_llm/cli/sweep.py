"""flm sweep render|submit|status|cancel|retry: sweeps of layouts as SLURM (or local) jobs."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys

import pandas as pd

from frontier_llm.cli import numbers
from frontier_llm.cli.common import add_command, add_format, db_parent, emit_frame
from frontier_llm.errors import ExitCode, UserError
from frontier_llm.specs.values import printable, printable_path

# Jobs a local dry run lists (the rest are in the manifest).
DRY_RUN_SHOWN = 20


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "sweep", "render, submit and track sweeps of layouts as SLURM jobs",
        "A sweep file (sweeps/*.yaml) names models, a system, node counts and a layout space; "
        "each layout becomes a job that runs flm bench and writes a trace. Jobs that share "
        "resources are submitted as one job array. Job state lives in the project database, "
        "so a repeated or interrupted command resumes without submitting anything twice.",
        [
            "flm sweep render sweeps/tiny-cpu.yaml --out runs/tiny-cpu",
            "flm sweep submit sweeps/tiny-cpu.yaml --out runs/tiny-cpu --max-in-flight 2",
            "flm sweep status tiny-cpu --wait --timeout 600",
            "flm sweep cancel tiny-cpu --hung",
            "flm sweep retry tiny-cpu --failed-only",
        ],
    )
    actions = p.add_subparsers(dest="sweep_command", metavar="ACTION")
    db = db_parent()

    def resources(q: argparse.ArgumentParser) -> None:
        g = q.add_argument_group("resources (override the sweep file)")
        g.add_argument("--account", default=None,
                       help="project to charge (sbatch -A); default $FLM_ACCOUNT. Required where "
                            "the site requires one (Frontier, LUMI)")
        for name in ("partition", "qos", "time"):
            g.add_argument(f"--{name}", default=None)
        g.add_argument("--allow-overtime", action="store_true",
                       help="write and submit jobs whose predicted runtime (start-up + steps x "
                            "predicted step time + margin) is over their --time")
        g.add_argument("--allow-oom", action="store_true",
                       help="write and submit layouts the cost model predicts not to fit in "
                            "a GPU's memory (refused by default: each would fail at its "
                            "first step; a space: with fits_only: false asks for them)")

    r = add_command(actions, "render", "write the job scripts and a manifest (no submission)",
                    "Expand the sweep and write DIR/scripts/*.sh (one per job array), "
                    "DIR/manifest.json and DIR/sweep.yaml. Nothing is submitted.",
                    ["flm sweep render sweeps/frontier-175b-weak.yaml --out runs/175b "
                     "--account ABC123"])
    r.add_argument("sweep", metavar="SWEEP.yaml")
    r.add_argument("--out", required=True, metavar="DIR", help="the sweep's folder")
    resources(r)
    r.set_defaults(func=_render)

    s = add_command(actions, "submit", "render and submit the sweep's jobs",
                    "Render into --out (default runs/NAME), record the jobs in the database and "
                    "submit every job not submitted yet, as job arrays. --max-in-flight N lets "
                    "at most N jobs of the sweep run at once (throttled arrays, one after the "
                    "other). With executor: local the jobs run here, in the foreground.",
                    ["flm sweep submit sweeps/tiny-cpu.yaml --dry-run",
                     "flm sweep submit sweeps/tiny-cpu.yaml --out runs/tiny --max-in-flight 2"],
                    parents=[db])
    s.add_argument("sweep", metavar="SWEEP.yaml")
    s.add_argument("--out", default=None, metavar="DIR",
                   help="the sweep's folder (default runs/NAME)")
    s.add_argument("--dry-run", action="store_true",
                   help="render and show what would be submitted; touch neither SLURM nor the "
                        "database")
    s.add_argument("--max-in-flight", type=numbers.count(1), default=None, metavar="N")
    s.add_argument("--hold", action="store_true", help="submit held (release with scontrol)")
    s.add_argument("--executor", choices=("slurm", "local"), default=None,
                   help="override the sweep's executor")
    resources(s)
    s.set_defaults(func=_submit)

    st = add_command(actions, "status", "poll the jobs and show what became of each",
                     "One batched scheduler query for all live jobs; each job is classified "
                     "from its state, exit code, log, trace and heartbeat as COMPLETED, OOM, "
                     "TIMEOUT, NODE_FAIL, PREEMPTED, CANCELLED, FAILED (with the first error "
                     "line) or HUNG; a job the scheduler no longer knows is judged by its trace, "
                     "else LOST (retryable). Attempts that ended before a requeue or a retry "
                     "show in the 'earlier' column. A controller that does not answer is "
                     "waited for (--outage-limit), not an error.",
                     ["flm sweep status tiny-cpu", "flm sweep status runs/tiny-cpu --wait "
                      "--timeout 900 --collect"],
                     parents=[db])
    _target(st)
    st.add_argument("--wait", action="store_true", help="poll (with back-off) until no job "
                    "is pending or running")
    st.add_argument("--timeout", type=numbers.seconds, default=3600.0,
                    help="seconds --wait waits; exit status 4 when jobs are still unfinished "
                         "then (the table shows them)")
    st.add_argument("--max-interval", type=numbers.seconds, default=15.0, metavar="S",
                    help="longest pause between two polls of --wait (back-off from 1 s)")
    st.add_argument("--hung-after", type=numbers.seconds, default=None, metavar="S",
                    help="a running job whose heartbeat is older than S seconds is HUNG "
                         "(default 1800)")
    _outage(st)
    st.add_argument("--collect", action="store_true",
                    help="also ingest the sweep's traces into the database (flm collect)")
    add_format(st)
    st.set_defaults(func=_status)

    c = add_command(actions, "cancel", "cancel the sweep's live jobs",
                    "scancel every pending or running job of the sweep (or the given ones).",
                    ["flm sweep cancel tiny-cpu", "flm sweep cancel tiny-cpu --hung"],
                    parents=[db])
    _target(c)
    c.add_argument("--job", action="append", default=None, metavar="KEY",
                   help="only this job (repeatable)")
    c.add_argument("--hung", action="store_true", help="only the jobs classified HUNG")
    _outage(c)
    c.set_defaults(func=_cancel)

    rt = add_command(actions, "retry", "resubmit ended jobs",
                     "Resubmit the jobs that ended: with --failed-only those that did not "
                     "complete (OOM, TIMEOUT, NODE_FAIL, PREEMPTED, CANCELLED, FAILED, LOST, "
                     "HUNG), else all.",
                     ["flm sweep retry tiny-cpu --failed-only"], parents=[db])
    _target(rt)
    rt.add_argument("--failed-only", action="store_true")
    _outage(rt)
    rt.add_argument("--max-in-flight", type=numbers.count(1), default=None, metavar="N")
    rt.set_defaults(func=_retry)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _outage(q: argparse.ArgumentParser) -> None:
    q.add_argument("--outage-limit", type=numbers.seconds, default=600.0, metavar="S",
                   help="when the SLURM controller does not answer (restart, failover), keep "
                        "asking with back-off for up to S seconds of outage (default 600), "
                        "showing 'controller unreachable since ...'; status then shows the "
                        "states as last seen and exits 4, cancel and retry exit 2 having "
                        "changed nothing")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _target(q: argparse.ArgumentParser) -> None:
    q.add_argument("sweep", metavar="SWEEP",
                   help="the sweep's file, its folder, or its name in the database")
    q.add_argument("--out", default=None, metavar="DIR", help="the sweep's folder")


def _overrides(args) -> dict:
    out = {k: getattr(args, k) for k in ("account", "partition", "qos", "time")}
    # The project to charge may come from the environment, so shipped sweeps need no edit.
    out["account"] = out["account"] or os.environ.get("FLM_ACCOUNT") or None
    return out


def _render(args) -> int:
    from frontier_llm.jobs.runner import sweep_with_overrides
    from frontier_llm.jobs.sweepdir import render_sweep

    sweep = sweep_with_overrides(args.sweep, **_overrides(args))
    _say_unsafe(sweep)
    manifest = render_sweep(sweep, args.out, args.allow_overtime, args.allow_oom)
    packed = ""
    if any(g.get("pack", 1) > 1 for g in manifest.groups):
        allocations = sum(_array_tasks(g) for g in manifest.groups)
        packed = f" ({allocations} allocations, up to {sweep.spec.pack} layouts each)"
    print(f"{len(manifest.jobs)} jobs in {len(manifest.groups)} scripts{packed}: "
          f"{manifest.directory}")
    _print_skipped(sweep.skipped)
    _print_warnings(manifest)
    return 0


def _say_unsafe(sweep) -> None:
    """A sweep's opt-in to settings that load code, on the terminal of whoever renders or
    submits it (the scripts and the manifest record it too; docs/security.md)."""
    from frontier_llm.jobs.unsafe import terminal_note

    if sweep.spec.allow_unsafe:
        _say(terminal_note(sweep.name, sweep.spec.allow_unsafe))


def _print_warnings(manifest) -> None:
    """The manifest's warnings (jobs/render_warnings.py), one line each on stderr."""
    for line in manifest.data.get("warnings") or ():
        print(f"warning: {line}", file=sys.stderr)


def _array_tasks(group: dict) -> int:
    """Array tasks of a rendered group: one per layout, or one per pack of ``pack`` layouts."""
    return -(-group["size"] // group.get("pack", 1))


def _print_skipped(skipped: dict) -> None:
    for reason, count in sorted(skipped.items(), key=lambda kv: -kv[1]):
        print(f"  skipped {count} layouts: {reason}", file=sys.stderr)


def _store(args, *, existing: bool = False):
    """The database; ``existing``: status, cancel and retry read a sweep's rows, so a missing
    SQLite file is a mistyped path, said in one line, never a new empty database."""
    from frontier_llm.store import open_existing, open_store

    return (open_existing if existing else open_store)(args.db)


def _submit(args) -> int:
    from frontier_llm.jobs import runner
    from frontier_llm.jobs.sweepdir import render_sweep

    if args.max_in_flight is not None and args.max_in_flight < 1:
        raise UserError("--max-in-flight must be at least 1")
    sweep = runner.sweep_with_overrides(args.sweep, **_overrides(args))
    out = args.out or runner.default_out(sweep.name)
    _say_unsafe(sweep)
    # Before anything is written (the folder, the database): a dry run says it too.
    runner.require_passed(sweep.spec.environment.pass_env or (),
                          runner.make_executor(args.executor or sweep.spec.executor))
    if args.dry_run:
        manifest = render_sweep(sweep, out, args.allow_overtime, args.allow_oom)
        executor = args.executor or sweep.spec.executor
        print(f"dry run: {len(manifest.jobs)} jobs in {len(manifest.groups)} arrays, "
              f"executor {executor}, folder {manifest.directory}")
        if executor == "local":
            # The local executor starts each job itself, one process group each: no sbatch.
            from frontier_llm.jobs.executors import local_command

            for job in manifest.jobs[:DRY_RUN_SHOWN]:
                print(f"  {job['key']}: " + shlex.join([*local_command(job["command"]),
                                                         *job["argv"]]))
            if len(manifest.jobs) > DRY_RUN_SHOWN:
                print(f"  ... and {len(manifest.jobs) - DRY_RUN_SHOWN} more (manifest.json)")
            _print_skipped(sweep.skipped)
            return 0
        for g in manifest.groups:
            spec = f"0-{_array_tasks(g) - 1}"
            spec += f"%{args.max_in_flight}" if args.max_in_flight else ""
            argv = ["sbatch", "--parsable", f"--array={spec}", str(manifest.path(g["script"]))]
            print("  " + shlex.join(argv))
        _print_skipped(sweep.skipped)
        _print_warnings(manifest)
        return 0
    store = _store(args)
    try:
        session = runner.prepare(sweep, out, store, executor=args.executor,
                                 allow_overtime=args.allow_overtime,
                                 allow_oom=args.allow_oom)
        with _job_progress(session, "submit"):
            counts = runner.submit(session, max_in_flight=args.max_in_flight, hold=args.hold)
        rows = session.state.rows()
    finally:
        store.close()
    print(f"submitted {counts['submitted']} jobs"
          + (f", adopted {counts['adopted']} from an interrupted submit" if counts["adopted"]
             else "")
          + (f", {counts['already']} already submitted" if counts["already"] else "")
          + f" ({session.manifest.directory})")
    print(runner.summary(rows))
    _print_warnings(session.manifest)
    return 0


@contextlib.contextmanager
def _job_progress(session, verb: str):
    """A bar of ended jobs over all jobs while ``session`` works (at a terminal only)."""
    from frontier_llm.cli.progress import Progress
    from frontier_llm.jobs import runner
    from frontier_llm.jobs.lifecycle import JobState

    with Progress(f"{verb} {session.manifest.sweep}") as bar:
        if bar.enabled:
            def watch(rows) -> None:
                ended = sum(JobState(r["state"]).terminal for r in rows)
                bar.update(ended, len(rows), session.outage or runner.summary(rows))

            session.watch = watch
        try:
            yield
        finally:
            session.watch = None


def _status(args) -> int:
    from frontier_llm.jobs import runner

    store = _store(args, existing=True)
    try:
        session = runner.resolve(args.sweep, args.out, store)
        session.say, session.outage_limit_s = _say, args.outage_limit
        if args.hung_after is not None:
            session.hung_after_s = args.hung_after
        if args.wait:
            with _job_progress(session, "wait"):
                rows = runner.wait(session, args.timeout, max_interval_s=args.max_interval)
        else:
            rows = runner.refresh(session, ride_out=True)
        if args.collect:
            from frontier_llm.store.ingest import collect

            report = collect(store, [session.manifest.trace_dir])
            runner.link_layouts(session)
            rows = session.state.rows()
            print(report.summary(store.url_redacted), file=sys.stderr)
            for path, reason in report.quarantined:
                print(f"flm sweep status: quarantined {printable_path(path)}: "
                      f"{printable(reason)}", file=sys.stderr)
        earlier = session.state.earlier_attempts()
    finally:
        store.close()
    frame = pd.DataFrame(rows, columns=["job_key", "state", "reason", "scheduler_job_id",
                                        "attempts", "run_id", "exit_code"])
    # Attempts that ended before the current one (SLURM requeued the job, or flm sweep retry).
    frame["earlier"] = [", ".join(f"{a['attempt']} {a['state']}" for a in earlier.get(k, []))
                        for k in frame["job_key"]]
    if args.format == "table":
        frame = frame.astype(object).where(frame.notna(), "")
    if args.format != "json":  # JSON escapes control characters itself
        # A reason is a scheduler's or a job's text: an ESC or U+202E in it would drive the
        # terminal or reorder what is read.
        frame = frame.map(lambda v: printable(v) if isinstance(v, str) else v)
    emit_frame(frame, args.format)
    print(runner.summary(rows), file=sys.stderr)
    for key, attempts in earlier.items():
        for a in attempts:
            if a["state"] in ("NODE_FAIL", "PREEMPTED", "LOST"):
                print(printable(f"  {key}: attempt {a['attempt']} {a['state']} "
                                f"({a['reason']}), log {a['log_path']}"), file=sys.stderr)
    if session.outage:
        print(f"flm: {session.outage}; gave up after --outage-limit {args.outage_limit:g} s "
              "or --timeout: the states above are as last seen", file=sys.stderr)
        return ExitCode.WAIT_TIMEOUT
    unfinished = runner.unfinished(rows) if args.wait else []
    if unfinished:
        # A script polling with --wait must not take a timeout for a finished sweep.
        print(f"flm: --timeout {args.timeout:g} s passed with {len(unfinished)} of {len(rows)} "
              "jobs unfinished", file=sys.stderr)
        return ExitCode.WAIT_TIMEOUT
    return 0


def _cancel(args) -> int:
    from frontier_llm.jobs import runner

    store = _store(args, existing=True)
    try:
        session = runner.resolve(args.sweep, args.out, store)
        session.say, session.outage_limit_s = _say, args.outage_limit
        keys = runner.require_keys(session.manifest, args.job)
        n = runner.cancel(session, keys, hung_only=args.hung)
    finally:
        store.close()
    print(f"cancelled {n} jobs of sweep {session.manifest.sweep}")
    return 0


def _retry(args) -> int:
    from frontier_llm.jobs import runner

    store = _store(args, existing=True)
    try:
        session = runner.resolve(args.sweep, args.out, store)
        session.say, session.outage_limit_s = _say, args.outage_limit
        counts = runner.retry(session, failed_only=args.failed_only,
                              max_in_flight=args.max_in_flight)
        rows = session.state.rows()
    finally:
        store.close()
    print(f"resubmitted {counts['submitted']} jobs of sweep {session.manifest.sweep}")
    print(runner.summary(rows))
    return 0
