"""DualPipe's layout rules (costmodel/dualpipe_rules.py): under ``--moe-overlap dualpipe`` the
planner keeps one schedule label (1f1b), an even pp of 2 or more and the Megatron-LM engine,
and rejects the rest with the rule's reason; flm predict refuses such a layout in one line;
a plan without DualPipe is untouched."""

from __future__ import annotations

import numpy as np
import pytest

from frontier_llm.catalog import load_model, load_system
from frontier_llm.cli import main
from frontier_llm.costmodel.dualpipe_rules import DUALPIPE_REASONS, dualpipe_codes
from frontier_llm.costmodel.moe import NO_OVERLAP, MoeRun
from frontier_llm.planner import REASONS, SearchSpace, plan
from frontier_llm.planner.space import OOM, enumerate_layouts
from frontier_llm.specs.layout import Engine, Schedule

DSV3 = load_model("deepseek-v3")
H800 = load_system("dgx-h800")
DUAL = MoeRun("dualpipe")
DUAL_CODES = [REASONS.index(r) for r in DUALPIPE_REASONS]


@pytest.fixture(scope="module")
def dsv3_dualpipe():
    return plan(DSV3, H800, 2048, moe_run=DUAL)


def test_dualpipe_plan_keeps_megatron_1f1b_even_pp(dsv3_dualpipe):
    """flm plan --model deepseek-v3 --system dgx-h800 --gpus 2048 --moe-overlap dualpipe: every
    valid row (and every ranked one) is Megatron-LM, 1f1b, pp even and >= 2; the others are
    rejected by DualPipe's rules, counted under their reasons."""
    p = dsv3_dualpipe
    ok = p.valid
    assert ok.sum() > 0
    t = p.layouts
    assert set(np.unique(t.schedule[ok])) == {Schedule.ONE_F_ONE_B.code}
    assert set(np.unique(t.engine[ok])) == {Engine.MEGATRON.code}
    assert np.all(t.pp[ok] % 2 == 0) and np.all(t.pp[ok] >= 2)
    ranked = p.ranked(20)
    assert set(ranked["schedule"]) == {"1f1b"} and set(ranked["engine"]) == {"megatron"}
    assert (ranked["pp"] % 2 == 0).all()
    # (Megatron-LM has no gpipe, and 61 blocks split into no interleaved chunks Megatron-LM
    # takes: the engine's own rules reject those first; the schedule rule: below, Mixtral.)
    assert p.rejections()[DUALPIPE_REASONS[0]] > 0
    # Each DualPipe rejection breaks the rule it names (and no earlier one).
    for code, broke in zip(DUAL_CODES, (
            (t.pp < 2) | (t.pp % 2 == 1),
            t.schedule != Schedule.ONE_F_ONE_B.code,
            t.engine != Engine.MEGATRON.code), strict=True):
        assert np.all(broke[p.reason == code])


def test_dualpipe_rejects_interleaving_a_megatron_layout_would_run():
    """Mixtral's 32 blocks interleave evenly under Megatron-LM: under DualPipe those layouts
    are rejected with the schedule's reason, and only 1f1b rows remain."""
    m = load_model("mixtral-8x7b")
    space = SearchSpace(engine=("megatron",), pp=(4,))
    plain = plan(m, load_system("dgx-h100"), 64, space=space)
    dual = plan(m, load_system("dgx-h100"), 64, space=space, moe_run=DUAL)
    inter = (plain.layouts.schedule == Schedule.INTERLEAVED.code) & plain.valid
    assert inter.any()
    assert np.all(dual.reason[inter] == DUAL_CODES[1])
    assert set(np.unique(dual.layouts.schedule[dual.valid])) == {Schedule.ONE_F_ONE_B.code}


def test_dualpipe_rejects_other_engines_when_asked_for():
    """An explicit --engine native under DualPipe is searched and rejected with the engine's
    reason (the open engine list becomes Megatron-LM's under DualPipe)."""
    p = plan(DSV3, H800, 2048, space=SearchSpace(engine=("native", "megatron"), pp=(16,)),
             moe_run=DUAL)
    native = p.layouts.engine == Engine.NATIVE.code
    assert native.any()
    assert not p.valid[native].any()
    assert p.rejections()[DUALPIPE_REASONS[2]] > 0


def test_dualpipe_codes_name_the_first_broken_rule():
    pp = np.array([1, 3, 16, 16, 16, 15])
    sched = np.array([1, 1, 0, 1, 1, 0])  # gpipe = 0, 1f1b = 1
    eng = np.array([Engine.MEGATRON.code] * 4 + [Engine.NATIVE.code] * 2)
    assert list(dualpipe_codes(pp, sched, eng)) == [1, 1, 2, 0, 3, 1]


@pytest.mark.parametrize("model, gpus", [("llama3-8b", 64), ("mixtral-8x7b", 64)])
def test_a_plan_without_dualpipe_is_untouched(model, gpus):
    """A dense model and an MoE model without DualPipe: no DualPipe reason anywhere, the
    native engine alone searched, and every row's reason the enumeration's (or memory's)."""
    m, s = load_model(model), load_system("dgx-h100")
    for run in (NO_OVERLAP, MoeRun("ep-a2a")):
        p = plan(m, s, gpus, moe_run=run)
        _, reason = enumerate_layouts(m, s, gpus, p.global_batch, SearchSpace())
        assert not np.isin(p.reason, DUAL_CODES).any()
        assert set(np.unique(p.layouts.engine)) == {Engine.NATIVE.code}
        same = p.reason != OOM
        assert np.array_equal(p.reason[same], reason[same])
        assert np.all(reason[~same] == 0)


PREDICT = ["predict", "--model", "deepseek-v3", "--system", "dgx-h800", "--tp", "1",
           "--ep", "64", "--engine", "megatron", "--micro-batch", "1", "--zero", "1",
           "--moe-overlap", "dualpipe"]


@pytest.mark.parametrize("extra, rule", [
    (["--pp", "3", "--dp", "64", "--global-batch", "1536"], DUALPIPE_REASONS[0]),
    (["--pp", "1", "--dp", "64", "--global-batch", "1536"], DUALPIPE_REASONS[0]),
    (["--pp", "2", "--dp", "64", "--global-batch", "1536", "--schedule", "interleaved",
      "--virtual-stages", "2", "--model", "mixtral-8x7b", "--ep", "8"], DUALPIPE_REASONS[1]),
    (["--pp", "16", "--dp", "128", "--global-batch", "15360", "--engine", "native"],
     DUALPIPE_REASONS[2]),
])
def test_predict_refuses_what_dualpipe_cannot_run(capsys, extra, rule):
    assert main(PREDICT + extra) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and rule in err


def test_predict_runs_the_report_layout_under_dualpipe(capsys):
    assert main([*PREDICT, "--pp", "16", "--dp", "128", "--global-batch", "15360",
                 "--format", "json"]) == 0
    # The same layout without DualPipe is not refused whatever its pp.
    assert main([*PREDICT[:-2], "--pp", "3", "--dp", "64", "--global-batch", "1536",
                 "--format", "json"]) == 0
