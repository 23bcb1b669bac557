"""Gzipped trainer logs are read as the text they hold (issue 49): a rotated or archived log
(``.log.gz``) gives the same runs as the plain file; a cut gzip stream is refused in one line."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from frontier_llm.logs.traces import parse_log
from frontier_llm.trainers.log_reader import LogError

DATA = Path(__file__).parent / "data" / "trainer_logs"


@pytest.mark.parametrize("name, trainer", [
    ("megatron_lm_756_mixtral_truncated.log", "megatron"),
    ("torchtitan_1625_ranks_model.log", "torchtitan"),
    ("deepspeed_1825_zero2.log", "deepspeed"),
])
def test_a_gzipped_log_reads_as_its_text(name, trainer, tmp_path):
    plain = DATA / name
    packed = tmp_path / f"{name}.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    want, got = parse_log(plain, trainer), parse_log(packed, trainer)
    assert got.lines == want.lines and len(got.runs) == len(want.runs) >= 1
    for a, b in zip(want.runs, got.runs, strict=True):
        assert (a.layout, a.model, [s.time_s for s in a.steps]) == (
            b.layout, b.model, [s.time_s for s in b.steps])


def test_a_cut_gzip_log_is_refused_in_one_line(tmp_path):
    packed = tmp_path / "cut.log.gz"
    packed.write_bytes(gzip.compress((DATA / "megatron_lm_91_arguments.log").read_bytes())[:200])
    with pytest.raises(LogError) as exc:
        parse_log(packed, "megatron")
    assert "damaged gzip" in str(exc.value) and "\n" not in str(exc.value)
