"""How many measured trials a search needs to find the best layout, on real measurements.

    python benchmarks/bench_tune.py [--seeds 20] [--table tests/data/tune_replay.csv]

The objective is a replay of tests/data/tune_replay.csv: every layout of
benchmarks/tune_replay_study.yaml measured with flm bench on this machine's CPU
(benchmarks/make_tune_replay.py). Three searches run through flm tune's own proposal code over
the same seeds:

  (a) TPE warm-started with the distinct layouts the cost model predicts fastest (flm tune's
      default), the model being the study's system: cpu-local-fit, calibrated on this CPU with
      `flm calibrate --from-runs` on runs of another model (benchmarks/tune_cpu_calibration.yaml),
      never on the replay table,
  (a1) the same with the catalog's uncalibrated cpu-local (its datasheet estimates),
  (a2) the same again without pricing run settings (tune/runcost.py): every bucket size of a
      layout predicted alike, so the warm start leaves the bucket to the sampler,
  (a3) the warm start before (the top 3 of (a2)'s ranking, run settings included, so its three
      trials may be one layout's bucket sizes),
  (b) plain TPE (no warm start),
  (c) random search (the baseline).

For each, the number of measured trials (jobs) until the best measured layout is found, and
until one within 5 % of it is; a search that does not get there within the whole space counts
as the space's size + 1. Prints the medians and the ratio of each to random search.
Target: (a) needs at most a third of random search's trials.

    python benchmarks/bench_tune.py --quick   # 2 seeds (seconds): what the tests run
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scipy.stats import spearmanr  # noqa: E402

from frontier_llm.catalog import load_system  # noqa: E402
from frontier_llm.tune.replay import load_table, search, trials_to_reach, values_by_key  # noqa
from frontier_llm.tune.space import Candidates  # noqa: E402
from frontier_llm.tune.spec import load_study  # noqa: E402

STRATEGIES = {
    "(a) TPE + model warm start": {"sampler": "tpe", "warm_start": 3},
    "(a1) same, uncalibrated model": {"sampler": "tpe", "warm_start": 3, "system": "cpu-local"},
    "(a2) same, no run-setting prices": {"sampler": "tpe", "warm_start": 3,
                                         "system": "cpu-local", "price_runs": False},
    "(a3) before: top 3 of one ranking": {"sampler": "tpe", "warm_start": 0,
                                          "system": "cpu-local", "price_runs": False,
                                          "top_of_ranking": 3},
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
    ap.add_argument("--only", nargs="+", metavar="S",
                    help="run these searches only: a a1 a2 a3 b c")
    ap.add_argument("--table", default=str(REPO / "tests" / "data" / "tune_replay.csv"))
    ap.add_argument("--quick", action="store_true",
                    help="2 seeds (seconds): what tests/test_benchmarks.py runs")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds = 2

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
    print(f"the cost model ({study.system.name}) ranks the measured best {model_rank} of {space}")
    models = {(study.system.name, True): cands}
    for kw in STRATEGIES.values():
        model = (kw.get("system", study.system.name), kw.get("price_runs", True))
        if model not in models:
            models[model] = Candidates.build(
                dataclasses.replace(study, system=load_system(model[0])), price_runs=model[1])
    by_measured = sorted(measured, key=measured.get, reverse=True)
    for (system, priced), c in models.items():
        name = system + ("" if priced else ", run settings not priced")
        rho = spearmanr([measured[k] for k in measured],
                        [c.lookup(_params(k)).prediction["tokens_per_s"] for k in measured])[0]
        # A point without a run setting (left to the sampler): the ranks of each of its values.
        warm = ["|".join(str(by_measured.index(x.key) + 1) for x in c.ranked()
                         if all(x.params[k] == v for k, v in p.items()))
                for p in c.warm_start_points(3)]
        print(f"{name}: predicted vs measured throughput Spearman {rho:.2f}; its warm start's "
              f"layouts measure {', '.join(warm)} of {len(measured)}"
              + (" (a|b: the sampler picks the bucket)" if any("|" in w for w in warm) else ""))
    results = {}
    t0 = time.monotonic()
    chosen = {k: v for k, v in STRATEGIES.items()
              if not args.only or k.split()[0].strip("()") in args.only}
    for name, kw in chosen.items():
        kw = dict(kw)
        c = models[(kw.pop("system", study.system.name), kw.pop("price_runs", True))]
        top = kw.pop("top_of_ranking", 0)
        if top:
            kw["warm_points"] = [dict(x.params) for x in c.ranked(top)]
        to_best, to_5 = [], []
        for seed in range(args.seeds):
            extra = {"n_startup_trials": args.n_startup} if kw["sampler"] == "tpe" else {}
            # The best reached ends the search: both counts are known by then.
            seq = search(c, values, seed=seed, budget=space, stop_at=best, **kw, **extra)
            to_best.append(trials_to_reach(seq, best) or space + 1)
            to_5.append(trials_to_reach(seq, 0.95 * best) or space + 1)
        results[name] = (statistics.median(to_best), statistics.median(to_5),
                         statistics.quantiles(to_best, n=4)[2] if len(to_best) > 1 else to_best[0])
    base = results.get("(c) random")
    print(f"{args.seeds} seeds, {time.monotonic() - t0:.0f} s, TPE start-up trials "
          f"{args.n_startup or 'default (10)'}; trials (jobs) needed, median"
          f"{'' if base else ' (no ratios: random search not run)'}:")
    # q3: the upper quartile over seeds of the trials to the best (how bad an unlucky seed is).
    print(f"{'search':<36}{'to best':>8}{'ratio':>7}{'to 5 %':>8}{'ratio':>7}{'q3 best':>9}")
    for name, (b, f, q3) in results.items():
        rb, rf = (f"{b / base[0]:.2f}", f"{f / base[1]:.2f}") if base else ("-", "-")
        print(f"{name:<36}{b:>8.1f}{rb:>7}{f:>8.1f}{rf:>7}{q3:>9.1f}")
    a = results.get("(a) TPE + model warm start")
    if a is None or base is None:
        return 0
    print(f"target (a) <= 1/3 of random: to best {a[0] / base[0]:.2f}, "
          f"to 5 % {a[1] / base[1]:.2f}")
    return 0


def _params(key: str) -> dict:
    import json

    return json.loads(key)


if __name__ == "__main__":
    sys.exit(main())
