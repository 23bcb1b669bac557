"""flm calibrate's fits, system file and bad-input handling (fast: no process is started).

The timings here are *generated* from a known latency-bandwidth model (and a known matrix-rate
curve) with multiplicative noise: a legitimate input for a fit, whose job is to recover the
parameters that made them. Real timings are exercised by tests/test_calibrate_cli.py.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from frontier_llm.calibrate.fit import fit_links, fit_matmul, ring_coefficients
from frontier_llm.calibrate.microbench import group_shapes, message_sizes
from frontier_llm.calibrate.shapes import block_gemms, scaled_model
from frontier_llm.catalog import load_model, load_system
from frontier_llm.cli import main
from frontier_llm.costmodel.flops import layer_forward_flops_per_token
from frontier_llm.errors import UserError
from frontier_llm.store import open_store

TRUE = {"node": (20e-6, 50e9), "network": (3e-6 * 1000, 12.5e9)}  # (alpha s, beta B/s)
OPS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")


def synthetic_collectives(noise: float = 0.05, seed: int = 1, sizes=None,
                          tiers=("node", "network"), group_sizes=(2, 8)) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for tier in tiers:
        alpha, beta = TRUE[tier]
        for op in OPS:
            for n in group_sizes:
                for nbytes in sizes or message_sizes(1024, 1 << 30):
                    c_lat, c_bw = ring_coefficients(op, n)
                    t = float(c_lat * alpha + c_bw * nbytes / beta)
                    rows.append({"library": "nccl", "op": op, "tier": tier, "group_size": n,
                                 "nbytes": nbytes, "time_s": t * rng.lognormal(0, noise)})
    return pd.DataFrame(rows)


def synthetic_matmul(rate=100e12, half=900.0, noise=0.03, seed=2) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    model = load_model("gpt3-1.3b")
    rows = []
    for h in (512, 1024, 2048, 4096, 8192):
        for tp in (1, 2, 4):
            for g in block_gemms(scaled_model(model, h), tp):
                side = min(g.n, g.k)  # the weight's smaller side (costmodel/gemm.py)
                g_rate = rate * side / (side + half)
                rows.append({"name": g.name, "tp": tp, "hidden": h, "m": g.m, "n": g.n,
                             "k": g.k, "flops": g.flops,
                             "time_s": g.flops / g_rate * rng.lognormal(0, noise)})
    return pd.DataFrame(rows)


def test_alpha_beta_fit_recovers_known_parameters_from_noisy_timings():
    fits = fit_links(synthetic_collectives())
    for tier, (alpha, beta) in TRUE.items():
        f = fits[("nccl", tier)]
        assert f.latency_s == pytest.approx(alpha, rel=0.10)
        assert f.bandwidth == pytest.approx(beta, rel=0.05)
        # 5 % lognormal noise: the residual reports it, neither hiding nor inflating it.
        assert 0.02 < f.rms_rel_residual < 0.10
        assert set(f.per_op_rms) == set(OPS) and f.group_sizes == (2, 8)


def test_matmul_fit_recovers_rate_and_size_effect():
    f = fit_matmul(synthetic_matmul(), "bf16")
    assert f.rate == pytest.approx(100e12, rel=0.05)
    assert f.half_hidden == pytest.approx(900.0, rel=0.15)
    assert f.rms_rel_residual < 0.05 and set(f.per_tp_rms) == {1, 2, 4}


def test_a_rate_still_rising_at_the_widest_width_gives_its_highest_rate_as_a_bound():
    """Timings where the rate never levels off (h½ far above every width, as noise at small
    widths on a loaded CPU can make it): the fit has no finite asymptote, so it reports the
    highest rate measured, says it is a bound, and still fits a size effect."""
    df = synthetic_matmul(noise=0.0)
    # A rate growing as the width squared: steeper than any h / (h + h½) can follow.
    h = df["hidden"].to_numpy(float)
    df["time_s"] = df["flops"] / (100e12 * (h / 8192) ** 2)
    achieved = (df.groupby("hidden")["flops"].sum() / df.groupby("hidden")["time_s"].sum())
    f = fit_matmul(df, "bf16")
    assert not f.saturated
    assert f.rate == pytest.approx(achieved.max(), rel=1e-6)
    assert f.half_hidden > 0 and f.predict(512) < f.predict(8192)
    assert fit_matmul(synthetic_matmul(), "bf16").saturated


@pytest.mark.parametrize("bad, message", [
    (lambda df: df[df["nbytes"].isin([1024, 4096])], r"2 message size\(s\) measured, need at "
     "least 3"),
    (lambda df: df.assign(time_s=np.where(df.index == 7, 0.0, df["time_s"])),
     "non-positive or missing time_s"),
    (lambda df: df.assign(time_s=np.where(df.index == 3, -1.0, df["time_s"])),
     "non-positive or missing time_s"),
    (lambda df: df.assign(group_size=1), "no group of 2 or more ranks"),
    (lambda df: df.iloc[0:0], "needs at least 2 ranks"),
])
def test_bad_timings_are_refused_with_one_line(bad, message):
    with pytest.raises(UserError, match=message):
        fit_links(bad(synthetic_collectives(tiers=("node",))))


def test_group_shapes_keep_each_group_inside_its_tier():
    hosts = ["a"] * 8 + ["b"] * 8
    shapes = group_shapes(hosts, gpus_per_package=2)
    tiers = [(s.tier, s.size) for s in shapes]
    assert tiers == [("package", 2), ("node", 8), ("network", 2), ("network", 16)]
    for s in shapes:
        flat = sorted(r for g in s.groups for r in g)
        assert flat == list(range(16))  # a partition: every rank in exactly one group
        for g in s.groups:
            same_host = len({hosts[r] for r in g}) == 1
            assert same_host == (s.tier != "network")
    # One CPU node of 2 ranks: one node shape of the pair, nothing else.
    assert [(s.tier, s.size) for s in group_shapes(["h", "h"])] == [("node", 2)]


def test_block_gemms_count_the_cost_models_dense_flops():
    model = load_model("small-gpt")
    for tp in (1, 2, 4):
        flops = sum(g.flops for g in block_gemms(model, tp))
        dense, _ = layer_forward_flops_per_token(model)
        assert flops * tp == pytest.approx(dense * model.seq_len)


def _results_doc(collectives: pd.DataFrame, matmul: pd.DataFrame) -> dict:
    return {"schema": "flm-calibration/1",
            "provenance": {"started_at": "2026-11-23T10:00:00+00:00",
                           "finished_at": "2026-11-23T10:05:00+00:00", "hosts": ["nid001"],
                           "node_count": 1, "world_size": 8, "dtype": "bf16",
                           "model": "gpt3-1.3b", "system": "dgx-h100",
                           "versions": {"torch": "2.13.0", "backend": "nccl"}},
            "matmul": matmul.to_dict(orient="records"),
            "collectives": collectives.to_dict(orient="records")}


def test_fit_writes_a_system_that_plan_accepts(tmp_path, capsys):
    """Synthetic results (a stand-in for a GPU node, which cannot run here) -> system file ->
    flm plan on it, unchanged; the file names where each figure came from."""
    res = tmp_path / "r.json"
    res.write_text(json.dumps(_results_doc(synthetic_collectives(tiers=("node",)),
                                           synthetic_matmul())))
    out = tmp_path / "h100-cal.yaml"
    db = f"sqlite:///{tmp_path}/flm.db"
    assert main(["calibrate", "fit", str(res), "--system", "dgx-h100", "--out", str(out),
                 "--db", db]) == 0
    system = load_system(str(out))
    assert system.links["node"].bandwidth == pytest.approx(50e9, rel=0.05)
    assert "alpha-beta fit" in system.links["node"].source
    # The network tier was not measured: the base's figure times its collective efficiency.
    base = load_system("dgx-h100")
    assert system.links["network"].bandwidth == pytest.approx(
        base.links["network"].bandwidth * base.eff("collective"), rel=1e-3)
    assert system.eff("matmul") == pytest.approx(100e12 / base.peak("bf16"), rel=0.05)
    assert system.site == base.site and "calibration" in system.sources
    capsys.readouterr()
    assert main(["plan", "--model", "gpt3-1.3b", "--system", str(out), "--gpus", "8",
                 "--top", "3"]) == 0
    assert "tp" in capsys.readouterr().out
    # Stored with provenance; fitting the same file again stores nothing new.
    assert main(["calibrate", "fit", str(res), "--system", "dgx-h100", "--db", db]) == 0
    assert "already stored" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["few_sizes", "nonpositive"])
def test_fit_cli_refuses_bad_tables_and_writes_nothing(tmp_path, capsys, damage):
    coll = synthetic_collectives(tiers=("node",),
                                 sizes=[1024, 4096] if damage == "few_sizes" else None)
    if damage == "nonpositive":
        coll.loc[5, "time_s"] = 0.0
    res = tmp_path / "r.json"
    res.write_text(json.dumps(_results_doc(coll, synthetic_matmul())))
    out = tmp_path / "sys.yaml"
    db = tmp_path / "flm.db"
    code = main(["calibrate", "fit", str(res), "--system", "dgx-h100", "--out", str(out),
                 "--db", f"sqlite:///{db}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("flm: error: ")
    assert not out.exists() and not db.exists()


def test_from_runs_on_an_empty_sweep_is_refused(tmp_path, capsys):
    db = f"sqlite:///{tmp_path}/flm.db"
    open_store(db).close()  # an empty database (flm db upgrade no longer creates one)
    capsys.readouterr()
    out = tmp_path / "fit.yaml"
    code = main(["calibrate", "--from-runs", "--sweep", "nothing", "--db", db,
                 "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "no completed runs" in err
    assert not out.exists()


@pytest.mark.parametrize("argv, words", [
    ([], "needs an action"),
    (["--from-runs"], "needs --sweep"),
    (["--from-runs", "--sweep", "s", "--knobs", "speed"], "unknown knob"),
])
def test_calibrate_usage_errors_are_one_line(tmp_path, capsys, argv, words):
    db = f"sqlite:///{tmp_path}/flm.db"
    if "--sweep" in argv:
        open_store(db).close()
        capsys.readouterr()
        argv = [*argv, "--db", db]
    assert main(["calibrate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err
