"""Ingest speed: write 10,000 realistic traces with the real trace writer, collect them, collect
them again; print seconds, traces/s and the database size.

Baseline, measured in the same run: a naive collector that stores 1,000 of the same traces row
by row (read_trace, then one transaction per trace with one INSERT per run, step and rank row,
looking the layout up first) into a fresh database of the same kind; the ratio is
collect's traces/s over the baseline's. Target (issue 4): 10,000 traces in under 20 s on SQLite.

The traces come from the store tests' factory (tests/store_fixtures.py): 12 layouts x 2
micro-batches x 2 ZeRO stages, 1-8 ranks each (one memory entry per rank), 10 steps, a
prediction with its breakdown; about 3.5 KB of JSON each.

It also times the trace check alone on 2,000 of the traces: the collector's fast check
(fastjsonschema, store/schema_check.py) against jsonschema (bench/trace.py validate_trace).

    python benchmarks/bench_ingest.py [--traces 10000] [--baseline 1000] [--db URL]
    python benchmarks/bench_ingest.py --quick   # 300 traces, baseline 100: seconds (the tests)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import select

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from store_fixtures import POSTGRES, many_traces  # noqa: E402

from frontier_llm.bench.trace import read_trace, validate_trace, write_trace  # noqa: E402
from frontier_llm.store import Store, open_store  # noqa: E402
from frontier_llm.store.ingest import _sharding_text, collect  # noqa: E402
from frontier_llm.store.schema import (  # noqa: E402
    flm_layouts,
    flm_predictions,
    flm_rank_memory,
    flm_runs,
    flm_steps,
)
from frontier_llm.store.schema_check import validate_trace_fast  # noqa: E402


def naive_ingest(store: Store, files: list[Path]) -> None:
    """What a first collector would do: one trace, one transaction, one statement per row."""
    for path in files:
        trace = read_trace(path)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        with store.write() as conn:
            lay = trace["layout"]
            lid = conn.execute(select(flm_layouts.c.id).where(
                flm_layouts.c.layout_hash == trace["layout_hash"])).scalar_one_or_none()
            if lid is None:
                sh = lay["sharding"]
                lid = conn.execute(flm_layouts.insert().values(
                    layout_hash=trace["layout_hash"], model_name=trace["model"]["name"],
                    system_name=trace["system"]["name"],
                    **{k: lay[k] for k in ("tp", "pp", "dp", "micro_batch", "global_batch",
                                           "schedule", "virtual_stages", "sequence_parallel",
                                           "recompute", "flash_attention", "dtype")},
                    sharding=_sharding_text(sh["params"], sh["grads"], sh["optim"]),
                    zero_stage=lay.get("zero_stage"), model_json=json.dumps(trace["model"]),
                    layout_json=json.dumps(lay))).inserted_primary_key[0]
            pred = trace["prediction"]
            have = conn.execute(select(flm_predictions.c.id).where(
                flm_predictions.c.layout_id == lid,
                flm_predictions.c.costmodel_version == pred["costmodel_version"]),
            ).scalar_one_or_none()
            if have is None:
                conn.execute(flm_predictions.insert().values(
                    layout_id=lid, costmodel_version=pred["costmodel_version"],
                    step_time_s=pred["step_time_s"], mfu=pred["mfu"],
                    peak_memory_bytes=int(pred["peak_memory_bytes"]), fits=pred["fits"],
                    breakdown_json=json.dumps(pred)))
            s = trace["summary"]
            run = conn.execute(flm_runs.insert().values(
                run_id=trace["run_id"], layout_id=lid, status=trace["status"],
                engine=trace["engine"], world_size=trace["environment"]["world_size"],
                steps_measured=s["steps_measured"], step_time_s=s["step_time_s"],
                peak_memory_bytes=s["peak_memory_bytes"], trace_path=str(path),
                trace_digest=digest, labels_json=json.dumps(trace["labels"]),
                environment_json=json.dumps(trace["environment"]),
            )).inserted_primary_key[0]
            for st in trace["steps"]:
                conn.execute(flm_steps.insert().values(run=run, **st))
            for m in trace["memory"]:
                conn.execute(flm_rank_memory.insert().values(run=run, **m))


def time_checks(traces: list[dict]) -> None:
    """Microseconds per trace of the fast check and of jsonschema, on the same documents."""
    validate_trace_fast(traces[0])  # compile outside the timing
    validate_trace(traces[0])
    out = {}
    for name, fn in (("fast check (fastjsonschema)", validate_trace_fast),
                     ("jsonschema", validate_trace)):
        t0 = time.perf_counter()
        for t in traces:
            fn(t)
        out[name] = (time.perf_counter() - t0) / len(traces) * 1e6
        print(f"validate one trace, {name:28s}: {out[name]:7.1f} us")
    print(f"speed-up of the fast check over jsonschema: "
          f"{out['jsonschema'] / out['fast check (fastjsonschema)']:.1f}x")


# Issue 4's target: 10,000 traces collected in under 20 s on SQLite.
TARGET_TRACES, TARGET_S = 10_000, 20.0


def target_line(seconds: float, traces: int) -> str:
    """The target's verdict on the rate measured: ``seconds`` for ``traces`` traces scaled to
    10,000 (a run of 100,000 in 67 s is 6.7 s per 10,000 and meets it; judging its whole 67 s
    against 20 s said MISSED)."""
    per_target = seconds * TARGET_TRACES / traces
    verdict = "met" if per_target < TARGET_S else "MISSED"
    return (f"target {TARGET_TRACES:,} traces < {TARGET_S:.0f} s: {verdict} "
            f"({per_target:.1f} s per {TARGET_TRACES:,}, from {traces:,} traces in "
            f"{seconds:.1f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=int, default=10_000)
    ap.add_argument("--baseline", type=int, default=1_000)
    ap.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite",
                    help="postgresql starts a throwaway server with scripts/postgres.sh")
    ap.add_argument("--quick", action="store_true",
                    help="300 traces, a baseline of 100 (seconds): what tests/test_benchmarks.py "
                         "runs")
    args = ap.parse_args()
    if args.quick:
        args.traces, args.baseline = 300, 100

    with tempfile.TemporaryDirectory(prefix="flm-bench-ingest-") as tmp:
        tmp = Path(tmp)

        def new_url(name: str) -> str:
            if args.db == "sqlite":
                return f"sqlite:///{tmp / name}.db"
            return POSTGRES.new_database()

        t0 = time.perf_counter()
        traces = many_traces(args.traces, prefix="bench")
        for t in traces:
            write_trace(tmp / "traces", t)
        time_checks(traces[:2000])
        files = sorted((tmp / "traces").glob("*.trace.json"))
        mb = sum(f.stat().st_size for f in files) / 1e6
        print(f"wrote {len(files)} traces ({mb:.1f} MB) with write_trace in "
              f"{time.perf_counter() - t0:.1f} s")

        store = open_store(new_url("flm"))
        first = collect(store, [tmp / "traces"])
        assert first.inserted == args.traces, first.as_dict()
        second = collect(store, [tmp / "traces"])
        assert second.unchanged == args.traces, second.as_dict()
        size = store.size_bytes()
        store.close()
        rate1 = args.traces / first.seconds
        rate2 = args.traces / second.seconds
        print(f"[{args.db}] collect, first time : {args.traces} traces in {first.seconds:.2f} s "
              f"= {rate1:,.0f} traces/s ({first.batches} batches)")
        print(f"[{args.db}] collect, again      : {args.traces} traces in {second.seconds:.2f} s "
              f"= {rate2:,.0f} traces/s (all unchanged)")
        print(f"[{args.db}] database size       : {size / 1e6:.1f} MB "
              f"({size / args.traces / 1e3:.1f} KB per trace)")

        base = open_store(new_url("naive"))
        t0 = time.perf_counter()
        naive_ingest(base, files[:args.baseline])
        naive_s = time.perf_counter() - t0
        base.close()
        rate0 = args.baseline / naive_s
        print(f"[{args.db}] baseline, row by row: {args.baseline} traces in {naive_s:.2f} s "
              f"= {rate0:,.0f} traces/s")
        print(f"[{args.db}] speed-up of collect over the baseline: {rate1 / rate0:.1f}x")
        print(f"[{args.db}] {target_line(first.seconds, args.traces)}")
    if args.db == "postgresql":
        POSTGRES.stop()


if __name__ == "__main__":
    main()
