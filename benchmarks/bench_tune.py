"""How many measured trials a search needs to find the best layout, on real measurements.

    python benchmarks/bench_tune.py [--seeds 20] [--table tests/data/tune_replay.csv]

The objective is a replay of tests/data/tune_replay.csv: every layout of
benchmarks/tune_replay_study.yaml measured with flm bench on this machine's CPU
(benchmarks/make_tune_replay.py). Three searches run through flm tune's own proposal code over
the same seeds:

  (a) TPE warm-started with the layouts the cost model predicts fastest (flm tune's default),
  (b) plain TPE (no warm start),
  (c) random search (the baseline).

For each, the number of measured trials (jobs) until the best measured layout is found, and
until one within 5 % of it is; a search that does not get there within the whole space counts
as the space's size + 1. Prints the medians and the ratio of each to random search.
Target: (a) needs at most a third of random search's trials.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from frontier_llm.tune.replay import load_table, search, trials_to_reach, values_by_key  # noqa
from frontier_llm.tune.spec import load_study  # noqa: E402

STRATEGIES = {
    "(a) TPE + model warm start": {"sampler": "tpe", "warm_start": 3},
    "(b) TPE": {"sampler": "tpe", "warm_start": 0},
    "(c) random": {"sampler": "random", "warm_start": 0},
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--n-startup", type=int, default=None, metavar="N",
                    help="TPE's random start-up trials (default: Optuna's, 10)")
    ap.add_argument("--study", default=str(REPO / "benchmarks" / "tune_replay_study.yaml"))
    ap.add_argument("--table", default=str(REPO / "tests" / "data" / "tune_replay.csv"))
    args = ap.parse_args(argv)

    study = load_study(args.study)
    cands = study.candidates
    values = values_by_key(load_table(args.table))
    measured = {k: v for k, v in values.items() if v is not None}
    space = len(cands.feasible())
    missing = [c for c in cands.feasible() if c.key not in values]
    best = max(measured.values())
    best_key = max(measured, key=measured.get)
    print(f"replay table: {len(values)} of {space} layouts measured "
          f"({len(missing)} missing, {len(values) - len(measured)} failed); best "
          f"{best:,.1f} tokens/s per rank: {cands.lookup(_params(best_key)).describe()}")
    model_rank = [c.key for c in cands.ranked()].index(best_key) + 1
    print(f"the cost model ranks the measured best {model_rank} of {space}")
    from scipy.stats import spearmanr

    keys = sorted(measured)
    rho = spearmanr([measured[k] for k in keys],
                    [cands.lookup(_params(k)).prediction["tokens_per_s"] for k in keys])[0]
    by_measured = sorted(measured, key=measured.get, reverse=True)
    top = [by_measured.index(c.key) + 1 for c in cands.ranked(3) if c.key in measured]
    print(f"predicted vs measured throughput: Spearman {rho:.2f}; the model's top 3 measure "
          f"{', '.join(map(str, top))} of {len(measured)}")
    results = {}
    t0 = time.monotonic()
    for name, kw in STRATEGIES.items():
        to_best, to_5 = [], []
        for seed in range(args.seeds):
            extra = {"n_startup_trials": args.n_startup} if kw["sampler"] == "tpe" else {}
            seq = search(cands, values, seed=seed, budget=space, **kw, **extra)
            to_best.append(trials_to_reach(seq, best) or space + 1)
            to_5.append(trials_to_reach(seq, 0.95 * best) or space + 1)
        results[name] = (statistics.median(to_best), statistics.median(to_5))
    base = results["(c) random"]
    print(f"{args.seeds} seeds, {time.monotonic() - t0:.0f} s, TPE start-up trials "
          f"{args.n_startup or 'default (10)'}; trials (jobs) needed, median:")
    print(f"{'search':<30}{'to best':>9}{'ratio':>8}{'to 5 %':>9}{'ratio':>8}")
    for name, (b, f) in results.items():
        print(f"{name:<30}{b:>9.1f}{b / base[0]:>8.2f}{f:>9.1f}{f / base[1]:>8.2f}")
    a = results["(a) TPE + model warm start"]
    print(f"target (a) <= 1/3 of random: to best {a[0] / base[0]:.2f}, "
          f"to 5 % {a[1] / base[1]:.2f}")
    return 0


def _params(key: str) -> dict:
    import json

    return json.loads(key)


if __name__ == "__main__":
    sys.exit(main())
