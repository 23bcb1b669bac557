"""The drift guard: the cost model judged on the whole calibration corpus, leave-one-source-out,
against the table it last earned (tests/golden/loso_families.csv), and the fastest layout it
picks for each row's stated shape against the last ones (tests/golden/calibration_fastest.csv).

A change that worsens any family with at least three rows by more than one point of mean error,
or the whole corpus at all, fails here, as does a change of any row's fastest layout, until the
goldens are regenerated:

    python analysis/loso_residuals.py

and the commit says why the move is worth it. The residuals are recomputed from scratch (every
source held out in turn, the fitted systems refitted without it: a few seconds), so nothing
here trusts a stored figure.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

from frontier_llm.planner import intervals
from frontier_llm.planner.calibration import load_calibration

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
REGENERATE = "python analysis/loso_residuals.py"
# A family may move this much (mean |error|, a fraction) before the guard fails; the corpus as
# a whole not at all beyond rounding.
FAMILY_SLACK = 0.01
ALL_SLACK = 0.0005
MIN_ROWS = 3


def _loso():
    sys.path.insert(0, str(ROOT / "analysis"))
    try:
        import loso_residuals
    finally:
        sys.path.remove(str(ROOT / "analysis"))
    return loso_residuals


@pytest.fixture(scope="module")
def now():
    loso = _loso()
    runs = load_calibration()
    residuals = loso.all_residuals(runs)
    return runs, residuals, intervals.family_numbers(residuals), loso.fastest_layouts(runs)


def worsened(golden: pd.DataFrame, table: pd.DataFrame) -> list[str]:
    """The families (of at least :data:`MIN_ROWS` rows in the golden) whose mean error grew by
    more than :data:`FAMILY_SLACK`, and ``all`` if it grew at all; a family gone is worse."""
    now = table.set_index("family")
    out = []
    for g in golden.itertuples():
        if g.family != "all" and g.rows < MIN_ROWS:
            continue
        if g.family not in now.index:
            out.append(f"{g.family}: gone (had {g.rows} rows)")
            continue
        n = now.loc[g.family]
        slack = ALL_SLACK if g.family == "all" else FAMILY_SLACK
        if n["mean_error"] > g.mean_error + slack:
            out.append(f"{g.family}: mean |error| {g.mean_error:.1%} -> {n['mean_error']:.1%} "
                       f"({int(n['rows'])} rows)")
    return out


def test_no_family_drifts_from_the_golden_table(now):
    _, _, table, _ = now
    golden = pd.read_csv(GOLDEN / "loso_families.csv")
    bad = worsened(golden, table)
    assert not bad, ("leave-one-source-out error worse than tests/golden/loso_families.csv: "
                     + "; ".join(bad) + f". If the move is worth it, rerun `{REGENERATE}` "
                     "and say why in the commit.")


def test_the_guard_catches_a_worse_family():
    """The comparison itself: a family one and a half points worse fails, one half a point worse
    passes; a two-row family is not guarded; the corpus as a whole is guarded to rounding."""
    golden = pd.DataFrame({"family": ["a", "b", "all"], "rows": [5, 2, 7],
                           "mean_error": [0.05, 0.05, 0.05]})
    assert worsened(golden, golden) == []
    worse = golden.assign(mean_error=[0.065, 0.20, 0.05])
    assert worsened(golden, worse) == ["a: mean |error| 5.0% -> 6.5% (5 rows)"]
    assert worsened(golden, golden.assign(mean_error=[0.055, 0.05, 0.05])) == []
    assert worsened(golden, golden.assign(mean_error=[0.05, 0.05, 0.052]))[0].startswith("all")
    assert worsened(golden, golden[golden["family"] != "a"])[0] == "a: gone (had 5 rows)"


def test_the_fastest_layout_of_each_row_has_not_changed(now):
    _, _, _, fastest = now
    golden = pd.read_csv(GOLDEN / "calibration_fastest.csv")
    merged = golden.merge(fastest, on=["file", "row"], how="outer", suffixes=("_golden", ""))
    changed = merged[merged["layout_golden"].fillna("") != merged["layout"].fillna("")]
    assert changed.empty, (
        "the planner's fastest layout moved for "
        + "; ".join(f"{r.file}:{r.row} {r.model}: {r.layout_golden} -> {r.layout}"
                    for r in changed.itertuples())
        + f". If intended, rerun `{REGENERATE}` and say why in the commit.")


def test_the_stored_residuals_are_the_code_s(now):
    """The residuals the planner's intervals read (planner/data/calibration_residuals.csv) are
    the ones this code computes: forgetting to regenerate them fails here."""
    _, residuals, _, _ = now
    stored = intervals.load_residuals()
    assert len(stored) == len(residuals)
    pd.testing.assert_series_equal(stored["loso_log_residual"].round(4),
                                   residuals["loso_log_residual"].astype(float).round(4),
                                   check_names=False)


def test_every_released_row_is_in_the_corpus_once():
    """Both released files are in the corpus, row for row (``origin``); a row is used or says
    why not; the measurements already in calibration_runs.csv are marked as duplicates."""
    runs = load_calibration()
    published = runs[runs["file"] == "calibration_runs_published.csv"]
    origins = set(published["origin"])
    for name, n in (("published_runs_a.csv", 54), ("published_runs_b.csv", 23)):
        assert {f"{name}:{i}" for i in range(n)} <= origins
    assert published["origin"].is_unique
    unused = published["unused"].fillna("")
    duplicates = published[unused.str.startswith("duplicate")]
    assert len(duplicates) == 4  # Narayanan's three ZeRO-3 174.6B rows, TorchTitan's Table 1
    assert (published["confidence"].isin(["high", "medium", "low"])).all()
    assert published["source"].notna().all()
