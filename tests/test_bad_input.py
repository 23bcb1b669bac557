"""Bad numbers and files that are not text, everywhere a command takes them: one line on stderr,
exit 2, at once (``flm plan --gpus 99999999999999999999`` used to enumerate divisors up to it),
nothing written. In-process calls of ``flm``'s main, so a hang would hang the test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from frontier_llm.cli import main

HUGE = "99999999999999999999"
TINY_CPU = Path(__file__).resolve().parents[1] / "sweeps" / "tiny-cpu.yaml"

# (id, argv, words the one line holds); {tmp} is the test's folder, {bin} a binary file there.
CASES = [
    ("plan-gpus-huge", ["plan", "--gpus", HUGE], "between 1 and 1,048,576"),
    ("plan-gpus-zero", ["plan", "--gpus", "0"], "between 1 and 1,048,576"),
    ("plan-gpus-negative", ["plan", "--gpus", "-8"], "between 1 and 1,048,576"),
    ("plan-gpus-word", ["plan", "--gpus", "many"], "whole number"),
    ("plan-gpus-above-max", ["plan", "--gpus", "1048577"], "between 1 and 1,048,576"),
    ("plan-global-batch", ["plan", "--global-batch", HUGE], "between 1 and"),
    ("plan-top", ["plan", "--top", "0"], "between 1 and"),
    ("plan-tp-list", ["plan", "--tp", f"8,{HUGE}"], "each value must be between"),
    ("plan-tp-zero", ["plan", "--tp", "0"], "each value must be between"),
    ("plan-micro-batch", ["plan", "--micro-batch", "1,x"], "comma-separated integers"),
    ("plan-engine", ["plan", "--engine", "jax"],
     "--engine takes comma-separated values of native, megatron, deepspeed"),
    ("predict-tp-huge", ["predict", "--model", "gpt-22b", "--system", "frontier", "--tp", HUGE],
     "--tp must be between"),
    ("predict-world-above-max", ["predict", "--model", "gpt-22b", "--system", "frontier",
                                 "--tp", "8", "--dp", "262144"], "above the maximum of 1,048,576"),
    ("predict-gpus", ["predict", "--model", "gpt-22b", "--system", "frontier", "--tp", "8",
                      "--gpus", "-1"], "between 1 and 1,048,576"),
    ("predict-global-batch", ["predict", "--model", "gpt-22b", "--system", "frontier", "--tp",
                              "1", "--global-batch", "4294967296"], "--global-batch must be"),
    ("bench-steps", ["bench", "--model", "tiny-gpt", "--steps", "0"], "between 1 and"),
    ("bench-steps-float", ["bench", "--model", "tiny-gpt", "--steps", "1e3"], "whole number"),
    ("bench-warmup", ["bench", "--model", "tiny-gpt", "--warmup", "-1"], "between 0 and"),
    ("bench-seed", ["bench", "--model", "tiny-gpt", "--seed", "-1"], "between 0 and"),
    ("bench-bucket-nan", ["bench", "--model", "tiny-gpt", "--bucket-mb", "nan"], "finite"),
    ("bench-bucket-zero", ["bench", "--model", "tiny-gpt", "--bucket-mb", "0"], "above 0"),
    ("bench-nproc", ["bench", "--model", "tiny-gpt", "--nproc", "100000"], "between 1 and 1,024"),
    ("bench-fault-step", ["bench", "--model", "tiny-gpt", "--fault-step", "-2"], "between 0"),
    ("bench-tp", ["bench", "--model", "tiny-gpt", "--tp", HUGE], "--tp must be between"),
    ("bench-memory-limit", ["bench", "--model", "tiny-gpt", "--memory-limit", "9" * 400,
                            "--trace-dir", "{tmp}/t"], "too large"),
    ("bench-engine", ["bench", "--model", "tiny-gpt", "--engine", "megatron", "--trace-dir",
                      "{tmp}/t"], "engine megatron is for planning only"),
    ("bench-config-binary", ["bench", "--config", "{bin}", "--trace-dir", "{tmp}/t"],
     "not a text file"),
    ("sweep-submit-in-flight", ["sweep", "submit", "x.yaml", "--max-in-flight", "0"],
     "between 1 and"),
    ("sweep-status-timeout", ["sweep", "status", "x", "--timeout", "inf"], "finite"),
    ("sweep-status-interval", ["sweep", "status", "x", "--max-interval", "-1"], "between 0"),
    ("sweep-status-hung", ["sweep", "status", "x", "--hung-after", "1e99"], "a week"),
    ("sweep-render-binary", ["sweep", "render", "{bin}", "--out", "{tmp}/out"],
     "not a text file"),
    ("collect-batch", ["collect", "{tmp}", "--batch-size", "0"], "between 1 and"),
    ("tune-poll", ["tune", "run", "x.yaml", "--poll", "-5"], "between 0"),
    ("tune-timeout", ["tune", "run", "x.yaml", "--timeout", "nan"], "finite"),
    ("tune-binary", ["tune", "run", "{bin}", "--db", "sqlite:///{tmp}/t.db"], "not a text file"),
    ("calibrate-folds", ["calibrate", "--from-runs", "--folds", "1"], "between 2 and"),
    ("calibrate-run-nproc", ["calibrate", "run", "--nproc", "0"], "between 1 and 1,024"),
    ("calibrate-run-timeout", ["calibrate", "run", "--timeout", "-1"], "between 0"),
    ("calibrate-run-bytes", ["calibrate", "run", "--max-bytes", "9" * 30 + "T"],
     "between 1 byte and 1T"),
    ("calibrate-run-tp", ["calibrate", "run", "--tp", "0"], "each value must be between"),
    ("calibrate-submit-nodes", ["calibrate", "submit", "--system", "frontier", "--nodes", HUGE],
     "between 1 and 1,048,576"),
    ("calibrate-submit-wait", ["calibrate", "submit", "--system", "frontier", "--nodes", "1",
                               "--wait-timeout", "inf"], "finite"),
    ("calibrate-fit-binary", ["calibrate", "fit", "{bin}", "--db", "sqlite:///{tmp}/t.db"],
     "not a text file"),
    ("report-binary-sweep", ["report", "scaling", "--sweep", "{bin}", "--out", "{tmp}/out",
                             "--db", "sqlite:///{tmp}/t.db"], "not a text file"),
    ("report-layouts-gpus", ["report", "layouts", "--sweep", "{tmp}/s.yaml", "--out",
                             "{tmp}/out", "--gpus", "0"], "between 1 and 1,048,576"),
    ("report-layouts-gpus-absent", ["report", "layouts", "--sweep", str(TINY_CPU), "--model-only",
                                    "--out", "{tmp}/out", "--gpus", "3"],
     "no layout of the sweep uses 3 GPUs (its layouts use 1, 2, 4)"),
    ("quickstart-steps", ["quickstart", "--out", "{tmp}/qs", "--steps", "0"],
     "--steps must be between 1 and 10,000"),
    ("quickstart-steps-huge", ["quickstart", "--out", "{tmp}/qs", "--steps",
                               "99999999999999999999"], "--steps must be between 1 and 10,000"),
    ("quickstart-trials", ["quickstart", "--out", "{tmp}/qs", "--trials", "-1"],
     "--trials must be between 1 and 1,000"),
    ("quickstart-layouts", ["quickstart", "--out", "{tmp}/qs", "--layouts", "7"],
     "--layouts must be between 1 and 6"),
    ("plan-model-binary", ["plan", "--model", "{bin}"], "not a text file"),
    ("predict-system-binary", ["predict", "--model", "tiny-gpt", "--system", "{bin}", "--tp",
                               "1"], "not a text file"),
]


@pytest.mark.parametrize(("argv", "words"), [(a, w) for _, a, w in CASES],
                         ids=[i for i, _, _ in CASES])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, words):
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\xe0\x80" + os.urandom(2048))
    argv = [a.replace("{tmp}", str(tmp_path)).replace("{bin}", str(binary)) for a in argv]
    before = set(tmp_path.iterdir())
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's refusal
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert words in err[0] and "Traceback" not in err[0], err[0]
    assert set(tmp_path.iterdir()) == before  # nothing written


# Numbers inside files: a model, a sweep. (file name, text, argv, words)
FILE_CASES = [
    ("model-layers", "m.yaml", "name: m\nlayers: 99999999999999999999\nhidden: 64\nheads: 4\n"
     "seq_len: 32\nvocab: 256\n", ["plan", "--gpus", "8", "--model", "{file}"],
     "layers must be at most 16,384"),
    ("model-vocab", "m.yaml", "name: m\nlayers: 4\nhidden: 64\nheads: 4\nseq_len: 32\n"
     f"vocab: {HUGE}\n", ["predict", "--model", "{file}", "--system", "frontier", "--tp", "1"],
     "vocab must be at most"),
    ("sweep-gpus", "s.yaml", "name: s\nsystem: cpu-local\nmodel: tiny-gpt\n"
     f"gpus: [{HUGE}]\nspace: auto\n", ["sweep", "render", "{file}", "--out", "{tmp}/out"],
     "gpus values must be at most 1,048,576"),
    ("sweep-steps", "s.yaml", "name: s\nsystem: cpu-local\nmodel: tiny-gpt\ngpus: [2]\n"
     f"steps: {HUGE}\nspace: auto\n", ["sweep", "render", "{file}", "--out", "{tmp}/out"],
     "steps must be at most"),
]


@pytest.mark.parametrize(("name", "text", "argv", "words"), [c[1:] for c in FILE_CASES],
                         ids=[c[0] for c in FILE_CASES])
def test_absurd_numbers_in_files_are_one_line_and_exit_2(tmp_path, capsys, name, text, argv,
                                                        words):
    path = tmp_path / name
    path.write_text(text)
    argv = [a.replace("{tmp}", str(tmp_path)).replace("{file}", str(path)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and str(path) in err[0], err
    assert not (tmp_path / "out").exists()
