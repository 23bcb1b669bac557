"""Hostile and careless input, fourth pass (issue 55), item 1: allow-lists where the set of bad
names is open. A sweep (or a system file of its own) may export the variables of a few
documented families and pass sbatch options by their full names; anything else only through
``allow_unsafe``, which the terminal shows at render and submit. Each case below passed the
deny-list of the pass before (jobs/unsafe.py) and was obeyed by srun, Python or sbatch."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from sweep_texts import local_sweep

from frontier_llm.cli import main

CPU_LOCAL = Path(__file__).parent.parent / "frontier_llm/catalog/systems/cpu-local.yaml"


def _sweep(tmp_path: Path, extra: str, name: str = "hostile") -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(local_sweep(name, ["{dp: 1, micro_batch: 2, name: one}"], extra))
    return path


def _render(tmp_path: Path, path: Path) -> list[str]:
    return ["sweep", "render", str(path), "--out", str(tmp_path / "run")]


def _refused(capsys, argv: list[str], words: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert words in err, err
    return err


@pytest.mark.parametrize(("name", "words"), [
    # srun runs SLURM_TASK_PROLOG before each task and exports SRUN_EXPORT_ENV's names (srun(1)).
    ("SLURM_TASK_PROLOG", "srun runs this program"),
    ("SRUN_EXPORT_ENV", "srun exports"),
    # Python loaded a forged .pyc from this folder in a local job (python(1)).
    ("PYTHONPYCACHEPREFIX", "compiled bytecode"),
    # The GPU runtimes' injection libraries, inside families a sweep may otherwise set.
    ("HSA_TOOLS_LIB", "names a file or folder"),
    ("CUDA_INJECTION64_PATH", "names a file or folder"),
    ("NCCL_NET_PLUGIN", "names a file or folder"),
    ("OMP_TOOL_LIBRARIES", "names a file or folder"),
    # A name no list knows.
    ("SINGULARITYENV_LD_PRELOAD", "is not in the families a sweep may set"),
])
def test_a_variable_outside_the_allow_list_is_refused(tmp_path, capsys, name, words):
    err = _refused(capsys, _render(tmp_path, _sweep(
        tmp_path, f"environment:\n  env: {{{name}: /tmp/x}}\n")), words)
    assert f"environment.env.{name}" in err and f"allow_unsafe: [{name}]" in err
    assert "/tmp/x" not in err
    assert not (tmp_path / "run").exists()


def test_the_families_pass_without_an_opt_in(tmp_path, capsys):
    path = _sweep(tmp_path, "environment:\n  env: {NCCL_DEBUG: INFO, FI_CXI_RX_MATCH_MODE: "
                  "hybrid, OMP_NUM_THREADS: 7, SWEEP_COUNTER: /tmp/c, MIOPEN_USER_DB_PATH: /t}\n")
    assert main(_render(tmp_path, path)) == 0
    assert "allow_unsafe" not in capsys.readouterr().err


@pytest.mark.parametrize(("option", "words"), [
    ("--ch=/tmp", "'--ch': not an sbatch option"),
    ("--er=/etc/cron.d/x", "'--er': not an sbatch option"),
    ("--inp=/home/me/.ssh/id_rsa", "'--inp': not an sbatch option"),
    ("--export-f=/tmp/env", "'--export-f': not an sbatch option"),
    ("--nodefile=/tmp/x", "'--nodefile': not an sbatch option"),
])
def test_an_sbatch_option_is_matched_whole_not_by_prefix(tmp_path, capsys, option, words):
    """sbatch, like getopt_long(3), obeys an unambiguous prefix: ``--ch=`` is ``--chdir=``."""
    err = _refused(capsys, _render(tmp_path, _sweep(
        tmp_path, f"resources:\n  extra_sbatch: [{json.dumps(option)}]\n")), words)
    assert "full long name" in err


def test_an_export_of_a_variable_outside_the_list_is_refused(tmp_path, capsys):
    _refused(capsys, _render(tmp_path, _sweep(
        tmp_path, 'resources:\n  extra_sbatch: ["--export=ALL,SLURM_TASK_PROLOG=/tmp/x"]\n')),
        "extra_sbatch --export sets SLURM_TASK_PROLOG")


def test_a_variable_name_ending_in_a_newline_is_refused(tmp_path, capsys):
    """``$`` matches before a final newline: ``export NAME`` and ``=VALUE`` split in two lines
    and the job ran ``./=VALUE``."""
    _refused(capsys, _render(tmp_path, _sweep(
        tmp_path, 'environment:\n  env: {"SWEEP_X\\n": "1"}\n')), "is not a valid variable name")


def test_an_opt_in_is_shown_on_the_terminal_at_render_and_submit(tmp_path, capsys):
    path = _sweep(tmp_path, "allow_unsafe: [PYTHONPYCACHEPREFIX]\n"
                  "environment:\n  env: {PYTHONPYCACHEPREFIX: /tmp/pyc}\n")
    note = "flm: sweep hostile opts in to allow_unsafe: PYTHONPYCACHEPREFIX"
    assert main(_render(tmp_path, path)) == 0
    assert note in capsys.readouterr().err
    assert main(["sweep", "submit", str(path), "--dry-run", "--out",
                 str(tmp_path / "run2")]) == 0
    assert note in capsys.readouterr().err
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["allow_unsafe"] == ["PYTHONPYCACHEPREFIX"]


def test_an_opt_in_the_sweep_does_not_use_is_a_mistake(tmp_path, capsys):
    _refused(capsys, _render(tmp_path, _sweep(tmp_path, "allow_unsafe: [LD_PRELAOD]\n")),
             "allow_unsafe: 'LD_PRELAOD' is not set by this sweep")


def test_an_opt_in_for_a_name_on_the_list_is_a_mistake(tmp_path, capsys):
    _refused(capsys, _render(tmp_path, _sweep(
        tmp_path, "allow_unsafe: [NCCL_DEBUG]\nenvironment:\n  env: {NCCL_DEBUG: INFO}\n")),
        "NCCL_DEBUG needs no opt-in")


def _custom_system(tmp_path: Path, env: str) -> Path:
    text = CPU_LOCAL.read_text()
    assert "\nsite:\n" in text
    system = tmp_path / "mysys.yaml"
    system.write_text(text.replace("\nsite:\n", f"\nsite:\n  env: {env}\n", 1))
    return system


@pytest.mark.parametrize(("env", "words"), [
    ("{LD_PRELOAD: /tmp/evil.so}", "site.env.LD_PRELOAD: ld.so"),
    ("{HF_TOKEN: hf_abcdefabcdef}", "site.env.HF_TOKEN is named like a secret"),
])
def test_a_system_file_beside_the_sweep_is_checked_like_the_sweep(tmp_path, capsys, env, words):
    """A shipped system's site is the centre's; a file beside the sweep is the sweep's author's:
    its ``site.env`` set LD_PRELOAD, and its secrets were written into every job script."""
    system = _custom_system(tmp_path, env)
    path = tmp_path / "s.yaml"
    path.write_text(local_sweep("hostile", ["{dp: 1, micro_batch: 2, name: one}"])
                    .replace("system: cpu-local", f"system: {system}"))
    err = _refused(capsys, _render(tmp_path, path), words)
    assert "hf_abc" not in err and "evil.so" not in err


# --- item 2: one opening per file --------------------------------------------------------------

TITAN = Path(__file__).parent / "data" / "trainer_logs" / "torchtitan_1437_flex_debug.log"
TITAN_ARGS = ["--trainer", "torchtitan", "--system", "h100-sxm", "--model", "tiny-llama",
              "--layout", "tp=1,pp=1,dp=1,micro_batch=8,global_batch=8"]


def test_a_log_swapped_for_a_link_after_listing_is_not_followed(tmp_path, capsys, monkeypatch):
    """collect --from-logs listed a folder (links checked) and opened each file by name later:
    a log replaced by a link to a private file in between was followed, and the private file's
    last line reached the database as the run's error. The swap is made here between the
    listing and the reading, with real files and a real link."""
    from frontier_llm.logs import traces

    private = tmp_path / "private.txt"
    private.write_text(TITAN.read_text() + "RuntimeError: token=hunter2-private\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.log").write_text(TITAN.read_text())
    (logs / "b.log").write_text(TITAN.read_text())
    real = traces.log_files

    def listed_then_swapped(paths, any_owner=False):
        out = real(paths, any_owner)
        (logs / "b.log").unlink()
        (logs / "b.log").symlink_to(private)  # what another user does between the two
        return out

    monkeypatch.setattr(traces, "log_files", listed_then_swapped)
    db = tmp_path / "flm.db"
    assert main(["collect", "--from-logs", str(logs), *TITAN_ARGS,
                 "--db", f"sqlite:///{db}", "--traces", str(tmp_path / "t"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "b.log: became a link after the folder was listed; not followed" in err, err
    with sqlite3.connect(db) as conn:
        stored = conn.execute("select error, labels_json from flm_runs").fetchall()
    assert len(stored) == 1 and "hunter2" not in str(stored)


def test_a_log_replaced_by_another_file_after_listing_is_not_read(tmp_path):
    from frontier_llm.logs.traces import log_files, parse_log
    from frontier_llm.trainers.log_reader import LogError

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.log").write_text(TITAN.read_text())
    (listed,), _ = log_files([logs])
    (tmp_path / "other.log").write_text(TITAN.read_text())
    os.replace(tmp_path / "other.log", logs / "a.log")  # same name, another file
    with pytest.raises(LogError, match="replaced after the folder was listed"):
        parse_log(listed.target, "torchtitan", listed.identity)


# --- item 3: numbers are numbers ---------------------------------------------------------------

MODEL = "name: m\nlayers: 4\nhidden: 64\nheads: 4\nseq_len: 32\nvocab: 256\n"


@pytest.mark.parametrize(("line", "words"), [
    ("layers: .nan", "layers must be an integer, not nan"),
    ("layers: .inf", "layers must be an integer, not inf"),
    ("layers: 16777216", "layers must be at most 16,384"),
    ("num_experts: .nan", "num_experts must be an integer, not nan"),
    ("top_k: -.inf", "top_k must be an integer, not -inf"),
])
def test_nan_and_infinity_in_an_integer_field_of_yaml_are_one_line(tmp_path, capsys, line,
                                                                   words):
    """``int(float("nan"))`` was a ValueError traceback for any integer field of any YAML
    file; 16.7 million layers, the old bound, ran flm plan for 109 s in 8.5 GB."""
    key = line.split(":")[0]
    text = "\n".join(x for x in MODEL.splitlines() if not x.startswith(key + ":"))
    model = tmp_path / "m.yaml"
    model.write_text(text + "\n" + line + "\n")
    _refused(capsys, ["plan", "--model", str(model), "--system", "cpu-local", "--gpus", "4"],
             words)


def test_nan_in_a_layouts_ep_is_one_line(tmp_path, capsys):
    _refused(capsys, _render(tmp_path, _layout_sweep(tmp_path, "ep: .nan")),
             "ep must be an integer, not nan")


def _layout_sweep(tmp_path: Path, knob: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(local_sweep("hostile", [f"{{dp: 1, micro_batch: 2, name: one, {knob}}}"]))
    return path


DATA = Path(__file__).parent / "data" / "trainer_logs"
MIXTRAL_LOG = DATA / "megatron_lm_756_mixtral_truncated.log"


def _megatron_args(values: dict[str, object]) -> str:
    from test_logs_moe import BASE, _arguments

    return _arguments({**BASE, **values}) + MIXTRAL_LOG.read_text()


def test_a_62_kb_moe_layer_freq_line_is_read_in_linear_time(tmp_path):
    """Trying every period against the whole list was quadratic: one 62 KB line, over 120 s.
    Counted by its answer, not timed (the time is in the report: 0.1 s)."""
    from frontier_llm.logs.traces import parse_log

    def read(pattern: list[int]) -> dict:
        path = tmp_path / "moe.log"
        path.write_text(_megatron_args({"num_experts": 8, "moe_router_topk": 2,
                                        "moe_layer_freq": pattern}))
        return parse_log(path, "megatron").runs[0].model

    every_third = [int(i % 3 == 0) for i in range(20_600)]  # 62 KB printed
    assert (read(every_third)["moe_layer_freq"], read(every_third)["dense_layers"]) == (3, 0)
    # No period fits (the last block is MoE out of turn): every period was tried in full.
    assert "moe_layer_freq" not in read([*every_third[:-1], 1])


DEEPSPEED_LOG = DATA / "deepspeed_1825_zero2.log"
TITAN_MODEL_LOG = DATA / "torchtitan_1625_ranks_model.log"


@pytest.mark.parametrize(("trainer", "good", "bad", "words"), [
    ("megatron", lambda: _megatron_args({}), lambda: _megatron_args({"num_experts": "inf"}),
     "must be an integer, not inf"),
    ("megatron", lambda: _megatron_args({}), lambda: _megatron_args({"num_layers": "nan"}),
     "must be an integer, not nan"),
    ("deepspeed", DEEPSPEED_LOG.read_text, lambda: DEEPSPEED_LOG.read_text().replace(
        "zero_optimization_stage ...... 2", "zero_optimization_stage ...... inf"),
     "must be an integer, not inf"),
    ("torchtitan", TITAN.read_text, lambda: TITAN_MODEL_LOG.read_text().replace(
        "n_layers=32", "n_layers=nan"), "model n_layers must be an integer, not nan"),
])
def test_inf_or_nan_in_a_logs_integer_refuses_that_file_only(tmp_path, trainer, good, bad,
                                                             words):
    """``int(float("inf"))`` in a parser was an OverflowError that stopped the whole folder;
    now the file is refused in one line and its neighbour becomes a trace."""
    from frontier_llm.logs.traces import LogOptions, logs_to_traces, parse_layout_option

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "bad.log").write_text(bad())
    (logs / "good.log").write_text(good())
    options = LogOptions("h100-sxm", "tiny-llama",
                         parse_layout_option("tp=1,pp=1,dp=1,micro_batch=8,global_batch=8"))
    report = logs_to_traces([logs], trainer, options, tmp_path / "t")
    refused = [r for r in report.refused if "bad.log" in r]
    assert len(refused) == 1 and words in refused[0] and "\n" not in refused[0], report.refused
    assert report.runs >= 1  # good.log was read: the folder goes on past the bad file


# --- item 6: the Python API raises the project's own errors -----------------------------------

@pytest.mark.parametrize(("call", "words"), [
    (lambda flm: flm.plan("tiny-gpt", "cpu-local", 4, tokens=float("nan")), "tokens: expected"),
    (lambda flm: flm.plan("tiny-gpt", "cpu-local", 4, tokens=-1e9), "tokens: expected"),
    (lambda flm: flm.predict("tiny-gpt", "cpu-local", dp=4, micro_batch=1, tokens=-1.0),
     "tokens: expected"),
    (lambda flm: flm.allocation("tiny-gpt", "cpu-local", tokens=float("nan")),
     "tokens: expected"),
    (lambda flm: flm.allocation("tiny-gpt", "cpu-local", tokens=1e9,
                                deadline_days=float("nan")), "deadline_days: expected"),
    (lambda flm: flm.plan("tiny-gpt", "cpu-local", 4, seq_len=float("nan")), "seq_len"),
    (lambda flm: flm.plan("tiny-gpt", "cpu-local", "8"), "gpus must be a number"),
    (lambda flm: flm.plan("tiny-gpt", "cpu-local", 4, top=-1), "top must be between 1"),
    (lambda flm: flm.predict("tiny-gpt", "cpu-local", flm.layout(dp=4, micro_batch=1), tp=1),
     "give a Layout or its fields, not both"),
    (lambda flm: flm.load_model(3), "model must be a name"),
])
def test_the_api_refuses_bad_numbers_with_its_own_error(call, words):
    """A NaN or negative token budget was answered (NaN days); a NaN seq_len or deadline was a
    ValueError, a str GPU count a TypeError from deep inside."""
    import frontier_llm.api as flm
    from frontier_llm.errors import UserError

    with pytest.raises(UserError) as err:
        call(flm)
    assert words in str(err.value) and "\n" not in str(err.value)


# --- item 4: names that become paths or cells --------------------------------------------------

@pytest.mark.parametrize("name", ["../../escaped", "{tmp}/abs-escaped"])
def test_report_plan_file_names_stay_inside_out(tmp_path, capsys, name):
    """The files were named after the model: ``../..`` or an absolute name wrote outside."""
    name = name.replace("{tmp}", str(tmp_path))
    model = tmp_path / "m.yaml"
    model.write_text(MODEL.replace("name: m", f"name: {json.dumps(name)}"))
    out = tmp_path / "a" / "b" / "out"
    assert main(["report", "plan", "--model", str(model), "--system", "cpu-local", "--tokens",
                 "1e9", "--curve", "4-8", "--out", str(out)]) == 0
    written = [Path(line.split(" ", 1)[1]) for line in capsys.readouterr().out.splitlines()
               if line.startswith("wrote ")]
    assert len(written) == 4
    for path in written:
        assert path.resolve().parent == out.resolve(), path
    assert not list(tmp_path.glob("a/*.csv")) and not list(tmp_path.glob("abs-escaped*"))


def test_csv_cells_that_start_like_a_formula_are_neutralised(tmp_path, capsys):
    """A run's error line (a log's, any text) ``=HYPERLINK(...)`` landed verbatim in ``flm
    results --format csv``, where a spreadsheet runs it."""
    import csv

    from store_fixtures import make_trace

    trace = make_trace("r1", status="failed")
    trace["error"] = '=HYPERLINK("http://x","y")'
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "a.trace.json").write_text(json.dumps(trace))
    db = f"sqlite:///{tmp_path}/flm.db"
    assert main(["collect", str(folder), "--db", db]) == 0
    capsys.readouterr()
    assert main(["results", "--db", db, "--format", "csv"]) == 0
    rows = list(csv.reader(capsys.readouterr().out.splitlines()))
    cells = [c for row in rows for c in row]
    assert not any(c.startswith(("=", "+", "@")) for c in cells), cells
    assert any(c.startswith("'=HYPERLINK") for c in cells), cells


def test_spreadsheet_safe_quotes_text_not_numbers():
    import pandas as pd

    from frontier_llm.report.tables import spreadsheet_safe

    df = pd.DataFrame({"name": ["=1+1", "+x", "-cmd", "@SUM(A1)", "plain"], "x": [-1.5, 2, 3,
                                                                                  4, 5]})
    out = spreadsheet_safe(df)
    assert list(out["name"]) == ["'=1+1", "'+x", "'-cmd", "'@SUM(A1)", "plain"]
    assert list(out["x"]) == [-1.5, 2, 3, 4, 5]


# --- item 5: secrets ----------------------------------------------------------------------------

@pytest.mark.parametrize("url", [
    "postgresql://me@127.0.0.1:1/flm?sslpassword=hunter2secret&sslmode=require",
    "postgresql://me:hunter2secret@127.0.0.1:1/flm?sslkey=/k&sslpassword=hunter2secret",
])
def test_sslpassword_is_never_printed(capsys, url):
    """libpq's sslpassword (the client key's passphrase) was printed in every connection
    error; SQLAlchemy's rendering hides only the credentials' password."""
    from frontier_llm.store.url import parse_url, redact, redact_text

    assert "hunter2" not in redact(url) and "hunter2" not in redact(parse_url(url))
    assert "hunter2" not in redact_text(f"failed for {url}: x")
    assert main(["db", "version", "--db", url]) == 2
    err = capsys.readouterr().err
    assert "hunter2" not in err and "sslpassword=***" in err, err


def test_pairs_that_are_no_secret_stay_readable():
    from frontier_llm.store.url import redact_text

    assert redact_text("max_tokens=4096 sslmode=require") == "max_tokens=4096 sslmode=require"


# --- left from before --------------------------------------------------------------------------

@pytest.mark.parametrize("line", [
    'export "HF_TOKEN=hf_literal"',
    "export HF_TOKEN=$'hf_literal'",
    "HF_TOKEN+=hf_literal",
    "declare -x HF_TOKEN=hf_literal",
    "read -r HF_TOKEN <<< hf_literal",
])
def test_secret_setup_lines_in_other_shapes_are_refused(tmp_path, capsys, line):
    extra = "environment:\n  setup:\n    - " + json.dumps(line) + "\n"
    err = _refused(capsys, _render(tmp_path, _sweep(tmp_path, extra)), "named like a secret")
    assert "hf_literal" not in err


@pytest.mark.parametrize("line", ['read -r HF_TOKEN < "$HOME/.hf_token"',
                                  'export HF_TOKEN="$(cat "$HOME/.hf_token")"',
                                  "read -r HF_TOKEN <<< \"$HF_SOURCE\""])
def test_secret_lines_that_read_from_elsewhere_pass(tmp_path, capsys, line):
    extra = "environment:\n  setup:\n    - " + json.dumps(line) + "\n"
    assert main(_render(tmp_path, _sweep(tmp_path, extra))) == 0


def test_a_nul_in_command_is_refused_at_load(tmp_path, capsys):
    """execve(2) takes C strings: a local submit was a ValueError traceback."""
    path = _sweep(tmp_path, 'command: ["echo", "a\\0b"]\n')
    _refused(capsys, ["sweep", "submit", str(path), "--out", str(tmp_path / "run"), "--db",
                      f"sqlite:///{tmp_path}/flm.db"], "command: a NUL character")


@pytest.mark.parametrize("argv", [["sweep", "status", "nosuch"], ["sweep", "cancel", "nosuch"],
                                  ["sweep", "retry", "nosuch"], ["db", "upgrade"]])
def test_a_mistyped_database_path_is_not_created(tmp_path, capsys, argv):
    db = tmp_path / "typo.db"
    _refused(capsys, [*argv, "--db", f"sqlite:///{db}"], "no database at")
    assert not db.exists()


def test_from_logs_errors_escape_control_characters(tmp_path, capsys):
    """A log named with an ESC sequence was printed raw in the refusal line."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a\x1b[2Jb.log").write_text("not a training log\n")
    assert main(["collect", "--from-logs", str(logs), *TITAN_ARGS, "--db",
                 f"sqlite:///{tmp_path}/flm.db", "--traces", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "a\\x1b[2Jb.log" in err, err


def test_a_cp_that_does_not_divide_the_gpus_is_named(capsys):
    err = _refused(capsys, ["plan", "--model", "tiny-gpt", "--system", "cpu-local", "--gpus",
                            "4", "--cp", "3"], "not a multiple of cp 3")
    assert "tp x cp x pp x dp" in err


@pytest.mark.parametrize(("old", "new", "words"), [
    ("fp32: 50.0e+9", "fp32: 50.0", "peak_flops.fp32 must be at least 1e+08"),
    ("bandwidth: 2.0e+9", "bandwidth: 2.0", "links.node.bandwidth must be at least 1,000,000"),
    ("latency: 50.0e-6", "latency: 5.0e+6", "links.node.latency must be at most 3,600"),
    ("memory_bytes: 4.0e+9", "memory_bytes: 4.0", "memory_bytes must be at least 1,048,576"),
])
def test_absurdly_small_system_rates_are_refused_with_the_reason(tmp_path, capsys, old, new,
                                                                 words):
    """A peak of 50 FLOP/s (TFLOP/s written as FLOP/s) planned step times of centuries."""
    system = tmp_path / "s.yaml"
    text = CPU_LOCAL.read_text()
    assert old in text
    system.write_text(text.replace(old, new, 1))
    _refused(capsys, ["plan", "--model", "tiny-gpt", "--system", str(system), "--gpus", "4"],
             words)


def test_nested_template_loops_are_bounded_together(tmp_path, capsys):
    """Each loop stayed under the sandbox's range bound (100,000), but two nested ran 10**10
    times and were never stopped; all loops of a render now count together. Counted, not
    timed: it stops at the 1,000,001st iteration."""
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "nest.sh.j2").write_text(
        '{% extends "local.sh.j2" %}{% block system_env %}{% for i in range(100000) %}'
        "{% for j in range(100000) %}{% endfor %}{% endfor %}{% endblock %}\n")
    path = folder / "sweep.yaml"
    path.write_text(local_sweep("tpl", ["{dp: 1, micro_batch: 2, name: one}"],
                                "template: nest.sh.j2\n"))
    _refused(capsys, _render(tmp_path, path), "loops that run more than 1,000,000 times")


def test_a_huge_automatic_space_is_refused_before_its_jobs_are_built(tmp_path, capsys):
    """An open space of 35,120 jobs was built whole (about a minute) before anything said so;
    the count is checked as each GPU count is planned."""
    path = tmp_path / "big.yaml"
    path.write_text("name: big\nmodel: gpt3-1.3b\nsystem: dgx-h100\ngpus: [1024, 2048]\n"
                    "space:\n  auto: true\n  fits_only: false\n")
    _refused(capsys, _render(tmp_path, path), "the space expands to more than 10,000 jobs")
    assert not (tmp_path / "run").exists()
