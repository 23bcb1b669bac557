"""flm bench says when its system file does not describe the machine it ran on: a run whose
measured step time is far from the prediction (190x with the built-in cpu-local) ends with
one line naming the flm calibrate command that measures this machine. Real trace files."""

from __future__ import annotations

import shlex

from store_fixtures import make_trace

from frontier_llm.bench.config import build_config
from frontier_llm.bench.trace import write_trace
from frontier_llm.cli import build_parser
from frontier_llm.cli.bench import calibration_hint


def _cfg(tmp_path, run_id):
    args = build_parser().parse_args(["bench", "--model", "tiny-gpt", "--system", "cpu-local",
                                      "--dp", "2", "--trace-dir", str(tmp_path),
                                      "--run-id", run_id])
    return build_config(args)


def test_a_prediction_far_off_the_measurement_suggests_calibrating(tmp_path):
    trace = make_trace("far", dp=2, predicted_step_time_s=0.011)  # measured 0.101 s
    write_trace(tmp_path, trace)
    hint = calibration_hint(_cfg(tmp_path, "far"))
    assert hint and "9x too fast against the measured 0.101 s" in hint
    assert "cpu-local does not describe this machine" in hint
    command = hint.split("`")[1]
    # The command it names is one flm takes as written.
    args = build_parser().parse_args(shlex.split(command)[1:])
    assert (args.nproc, args.system, args.out) == (2, "cpu-local", "here.yaml")


def test_a_near_prediction_says_nothing(tmp_path):
    write_trace(tmp_path, make_trace("near", dp=2, predicted_step_time_s=0.1))
    assert calibration_hint(_cfg(tmp_path, "near")) is None
    assert calibration_hint(_cfg(tmp_path, "absent")) is None
