"""The quickstart's calibration stage, piece by piece: the microbenchmark run from Python (real
ranks, real gloo collectives), its Ctrl-C behaviour, and the scores and the errors report the
quickstart compares its three system files with. The whole stage runs in the quickstart's
end-to-end test (tests/test_quickstart.py)."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from frontier_llm.calibrate.fit import fit_links, fit_matmul
from frontier_llm.calibrate.local import measure
from frontier_llm.calibrate.microbench import WorkerConfig
from frontier_llm.calibrate.results import load_results
from frontier_llm.calibrate.shapes import gemm_set
from frontier_llm.catalog import load_model
from frontier_llm.quickstart import Settings
from frontier_llm.quickstart.calibration import Refit, _gemms, kept_calibration, score
from frontier_llm.quickstart.files import study_text, sweep_text
from frontier_llm.report.errors import errors_table

# Messages to 4 MiB, as the quickstart measures: at 1 MiB a loaded machine's timings can be all
# start-up and noise, and the fit rightly refuses a bandwidth (one run in about eight did).
SMALL = dict(dtype="fp32", min_bytes=1024, max_bytes=4 * 1024**2, mpi=False,
             matmul_budget_s=0.01, ops=("all_reduce", "send_recv"))


def _config() -> WorkerConfig:
    return WorkerConfig(gemms=gemm_set(load_model("tiny-gpt"), [1, 2], [64]), **SMALL)


def test_measure_runs_the_microbenchmark_from_python_and_reports_progress(tmp_path):
    out = tmp_path / "r.calibration.json"
    lines: list[str] = []
    assert measure(_config(), 2, out, "tiny-gpt", "cpu-local", timeout_s=120,
                   on_progress=lines.append) == 0
    res = load_results(out)
    assert res.provenance["world_size"] == 2 and res.provenance["model"] == "tiny-gpt"
    assert set(res.collectives["op"]) == {"all_reduce", "send_recv"}
    assert sorted(res.collectives["nbytes"].unique()) == [4**k * 1024 for k in range(7)]
    assert fit_links(res.collectives)[("gloo", "node")].bandwidth > 0
    assert fit_matmul(res.matmul, "fp32").rate > 0
    assert lines[0].endswith("GEMMs timed") and any("all_reduce done" in x for x in lines)
    assert (tmp_path / "r.calibration.log").is_file()


def test_an_interrupted_measure_kills_its_ranks_and_writes_no_results(tmp_path):
    """Ctrl-C in the caller (here: raised from the progress callback, the first time rank 0
    says something) ends every rank and leaves no results file behind."""
    out = tmp_path / "r.calibration.json"
    seen: list[int] = []
    # Children this process had before (a server an earlier test of this session started,
    # under pytest-xdist a worker's own): not the measurement's ranks.
    before = set(_children(os.getpid()))

    def interrupt(line: str) -> None:
        seen.extend(p for p in _children(os.getpid()) if p not in before)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        measure(_config(), 2, out, "tiny-gpt", "cpu-local", timeout_s=120,
                on_progress=interrupt)
    assert len(seen) == 2  # both ranks were alive when it was interrupted
    assert not out.exists()
    for pid in seen:  # killed and reaped: no process, not even a zombie
        assert not os.path.exists(f"/proc/{pid}")


def test_a_failed_rank_ends_the_measurement_without_waiting_for_its_peers(tmp_path, monkeypatch):
    """Rank 1 exits with 3 at once while rank 0 would wait ten minutes (as a rank does in a
    rendezvous or collective whose peer is gone): measure returns 3 after the grace, not the
    timeout, and leaves no rank behind. The ranks are real processes running a stand-in body:
    a real microbenchmark rank cannot be made to fail on one rank only."""
    import sys
    import time

    from frontier_llm.calibrate import local

    body = ("import os, sys, time\n"
            "sys.exit(3) if os.environ['RANK'] == '1' else time.sleep(600)")
    monkeypatch.setattr(local, "python_module", lambda module, args: [sys.executable, "-c", body])
    before = set(_children(os.getpid()))
    started = time.monotonic()
    code = measure(_config(), 2, tmp_path / "r.calibration.json", "tiny-gpt", "cpu-local",
                   timeout_s=300)
    assert code == 3
    assert time.monotonic() - started < 120  # the grace (10 s), not the 300 s timeout
    assert set(_children(os.getpid())) <= before


def _children(parent: int) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _child_of(int(p), parent)]


def _child_of(pid: int, parent: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(") ", 1)[1].split()[1]) == parent
    except (OSError, IndexError, ValueError):
        return False


def test_the_quickstart_measures_its_own_model_on_its_own_ranks():
    gemms = _gemms(Settings())
    assert {g.tp for g in gemms} == {1, 2, 4}  # every TP degree its plan can choose
    assert {g.hidden for g in gemms} == {16, 32, 64, 128}  # the size ladder around 64


def test_the_sweep_and_study_files_name_the_file_that_predicts():
    s = Settings()
    assert "system: /x/microbench.yaml\n" in sweep_text(s, [], "/x/microbench.yaml")
    assert "system: /x/refit.yaml\n" in study_text(s, "/x/refit.yaml")
    assert "system: cpu-local\n" in study_text(s)


def test_the_study_keeps_the_calibration_with_the_lower_held_out_error():
    """A refit whose held-out error is worse than the microbenchmark file's is not used (one
    run: held-out 87 % against 67 %, and the study predicted with the refit)."""
    def fit(after):
        return Refit(None, pd.DataFrame({"measured_s": [1.0, 2.0], "per_rank_batch": [1, 1],
                                         "before_s": [1.67, 3.34], "after_s": after}), {})

    kept, why = kept_calibration(fit([1.87, 3.74]))  # held out 87 %, microbenchmark 67 %
    assert kept == "microbench"
    assert why == ("kept the microbenchmark file: its step-time error 67.0 % is below the "
                   "refit's held-out 87.0 %")
    kept, why = kept_calibration(fit([1.2, 2.4]))  # held out 20 %
    assert kept == "refit" and "held-out step-time error 20.0 %" in why


def test_score_is_the_step_time_mape_and_the_rank_correlation_of_throughput_per_rank():
    measured = [1.0, 2.0, 4.0]
    mape, rho = score(measured, [2.0, 4.0, 8.0], [1, 1, 1])  # 2x slow, same order
    assert mape == pytest.approx(100.0) and rho == pytest.approx(1.0)
    mape, rho = score(measured, [4.0, 2.0, 1.0], [1, 1, 1])  # the order reversed
    assert rho == pytest.approx(-1.0)
    # Throughput per rank, not step time: the two-rank run (twice the batch) is predicted to
    # deliver more per rank than the one-rank run, and measured to deliver less.
    _, rho = score([1.0, 2.5], [1.0, 1.5], [1, 2])
    assert rho == pytest.approx(-1.0)


def test_the_errors_table_compares_systems_on_the_same_runs_without_pooling_them():
    runs = pd.DataFrame({"run_id": ["a", "b", "c"], "engine": "native",
                         "world_size": [1, 2, 4], "global_batch": [2, 4, 8],
                         "measured_step_time_s": [1.0, 2.0, 3.0],
                         "measured_peak_memory_bytes": 100, "predicted_peak_memory_bytes": 100,
                         "memory_error_pct": 0.0})
    frames = []
    for label, pred in (("built-in: x", [0.1, 0.3, 0.2]), ("refit: x", [1.1, 2.1, 2.9])):
        f = runs.assign(system=label, predicted_step_time_s=pred)
        f["step_time_error_pct"] = (f["predicted_step_time_s"] / f["measured_step_time_s"]
                                    - 1) * 100
        frames.append(f)
    table = errors_table(pd.concat(frames), overall=False)
    assert list(table["system"]) == ["built-in: x", "refit: x"]  # no "(all)" row
    refit = table.set_index("system").loc["refit: x"]
    assert refit["step_time_mape_pct"] == pytest.approx(np.mean([10, 5, 100 / 30]))
    assert refit["throughput_rank_corr"] == pytest.approx(1.0)
    assert table.set_index("system").loc["built-in: x", "throughput_rank_corr"] < 1
    assert "(all)" in list(errors_table(pd.concat(frames))["system"])
