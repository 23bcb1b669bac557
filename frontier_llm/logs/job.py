"""A sweep job's trainer log -> the job's trace: what a trainer workload's job script runs when
the trainer ends (``python -m frontier_llm.logs.job``; frontier_llm/jobs/workload.py).

The model, system and layout are the job's (given here, never read from the log); the run id is
the job's, so ``flm sweep status --collect``, ``flm validate``, the reports and ``flm tune`` treat
the run as they treat a bench run. The log gives the steps, the memory, the loss and how it
ended; the trainer's exit status says whether it failed: a non-zero exit with no step line is a
failure (an OOM line: oom), and a non-zero exit after steps is a failure that kept its steps.
A job ended by SLURM's SIGTERM (its time limit or a cancel; the job script passes ``--signal
TERM``) is a timeout, as ``flm bench`` writes on any SIGTERM, with the steps printed before it:
the scheduler's own state (TIMEOUT, CANCELLED) tells the two apart (jobs/classify.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

from frontier_llm.bench.record import trace_record
from frontier_llm.bench.trace import validate_trace, write_trace
from frontier_llm.errors import UserError
from frontier_llm.logs.traces import LogOptions, build_trace, parse_log
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.vocab import RunStatus
from frontier_llm.trainers import NAMES, get
from frontier_llm.trainers.log_reader import LogError, ParsedRun


def _last_run(log_path: Path, trainer: str) -> tuple[ParsedRun | None, str | None]:
    """The log's last run (a job runs one; a requeue appends) and, if none, why."""
    try:
        log = parse_log(log_path, get(trainer).log_reader.name)
    except LogError as exc:
        return None, str(exc)
    with_steps = [r for r in log.runs if r.steps]
    if not (with_steps or log.runs):
        # Lines of the trainer, but none a run holds (start-up lines only: a job stopped
        # while its ranks met): no run, and the stepless trace says so.
        return None, "no step line in the log"
    return (with_steps or log.runs)[-1], None


def _stepless_trace(run: ParsedRun | None, why: str | None, options: LogOptions, run_id: str,
                    exit_code: int, labels: dict[str, str], signal: str | None = None) -> dict:
    """A run that printed no step: failed (oom when the log says so), with the prediction."""
    from frontier_llm.bench.run import summarize
    from frontier_llm.catalog import load_system

    system = load_system(str(options.system))
    model, layout = options.model_spec, options.layout_spec
    assert model is not None and layout is not None
    cfg = SimpleNamespace(model=model, system=system, layout=layout)
    status = RunStatus.OOM if run is not None and run.status == RunStatus.OOM else \
        RunStatus.TIMEOUT if signal else RunStatus.FAILED
    error = (run.error if run is not None and run.error else why) or "no step line in the log"
    if signal and status == RunStatus.TIMEOUT:
        error = f"stopped by SIG{signal} (time limit or cancel) before a step line: {error}"
    now = datetime.now(UTC).isoformat(timespec="seconds")
    trace = trace_record(
        cfg, run_id=run_id, status=status, error=f"{error} (trainer exit status {exit_code})",
        started_at=now, finished_at=now, labels=labels,
        environment={"hostnames": [], "world_size": layout.world_size, "backend": "unknown",
                     "device": "unknown", "launcher": labels["trainer"], "versions": {}},
        summary=summarize(cfg, [], [], layout.world_size))
    validate_trace(trace)
    return trace


def job_trace(trainer: str, log: Path, run_id: str, exit_code: int, model_ref: str,
              system_ref: str, layout: Layout, sweep: str, job_key: str,
              signal: str | None = None) -> dict:
    """The job's trace from its trainer's log (schema-valid; never raises for the log's
    content: a log that yields no steps gives a failed trace that says why). ``signal``: the
    signal that ended the job (``TERM``), whose trace is a timeout holding the steps so far."""
    from frontier_llm.catalog import load_model

    trainer = get(trainer).name  # UnknownTrainer (a UserError) names the choices
    options = LogOptions(system=system_ref, model=model_ref, sweep=sweep,
                         model_spec=load_model(model_ref), layout_spec=layout)
    labels = {"source": "trainer-log", "log": str(log.resolve()), "trainer": trainer,
              "sweep": sweep, "job_key": job_key}
    run, why = _last_run(log, trainer)
    trace = None
    if run is not None and run.steps:
        try:
            trace = build_trace(run, log, options)
        except (UserError, ValueError) as exc:
            why = str(exc)
    if trace is None:
        return _stepless_trace(run, why, options, run_id, exit_code, labels, signal)
    trace["run_id"] = run_id
    trace["labels"].update(labels)
    trace["labels"]["trainer"] = trainer  # the workload's name, not only its log format's
    if signal and trace["status"] in (RunStatus.COMPLETED, RunStatus.FAILED):
        last = trace["steps"][-1]["step"]
        trace["status"] = str(RunStatus.TIMEOUT)
        trace["error"] = (f"stopped by SIG{signal} (time limit or cancel) after step {last}; "
                          f"the steps are those printed before (trainer exit status {exit_code})")
    elif exit_code != 0 and trace["status"] == RunStatus.COMPLETED:
        trace["status"] = str(RunStatus.FAILED)
        trace["error"] = f"the trainer exited with status {exit_code}"
    validate_trace(trace)
    return trace


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m frontier_llm.logs.job", description=__doc__)
    ap.add_argument("--trainer", required=True, choices=NAMES)
    ap.add_argument("--log", required=True, type=Path)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--trace-dir", required=True, type=Path)
    ap.add_argument("--exit-code", type=int, default=0)
    ap.add_argument("--model", required=True, help="the job's model (catalog name or YAML)")
    ap.add_argument("--system", required=True, help="the job's system")
    ap.add_argument("--layout-json", required=True, help="the job's layout (Layout.to_dict)")
    ap.add_argument("--sweep", required=True)
    ap.add_argument("--job-key", required=True)
    ap.add_argument("--signal", choices=["TERM"],
                    help="the job was signalled (SLURM's time limit or scancel): a timeout")
    args = ap.parse_args(argv)
    try:
        layout = Layout.from_dict(json.loads(args.layout_json))
        trace = job_trace(args.trainer, args.log, args.run_id, args.exit_code, args.model,
                          args.system, layout, args.sweep, args.job_key, args.signal)
        path = write_trace(args.trace_dir, trace)
    except (UserError, ValueError) as exc:
        print(f"flm: no trace for {args.run_id}: {exc}", file=sys.stderr)
        return 1
    print(f"flm: {trace['status']} trace {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
