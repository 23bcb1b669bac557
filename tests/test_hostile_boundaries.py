"""Hostile and careless input, third pass (issue 38): what a file or a name says can run no
code, leak no secret and poison no database, and every refusal is one line with exit 2.

Each test names its item of the issue. Real parts throughout: the CLI's ``main``, real YAML
files, real SQLite, real processes for the cancel test; a read-only file system is a real tmpfs
(skipped only where this process may not mount one).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from store_fixtures import make_trace
from sweep_texts import local_sweep
from test_hostile_input import _tmpfs

from frontier_llm.cli import main
from frontier_llm.jobs.executors import LocalExecutor, _same_process

CPU_LOCAL = (Path(__file__).parent.parent / "frontier_llm/catalog/systems/cpu-local.yaml")
MODEL = "layers: 4\nhidden: 64\nheads: 4\nseq_len: 32\nvocab: 256\n"


def _one_line(capsys, argv: list[str], words: str) -> str:
    assert main(argv) == 2
    _out, err = capsys.readouterr()
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert words in err, err
    return err


def _sweep(tmp_path: Path, extra: str, layouts: str = "{dp: 1, micro_batch: 2, name: one}",
           name: str = "hostile") -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(local_sweep(name, [layouts], extra))
    return path


def _render(tmp_path: Path, path: Path) -> list[str]:
    return ["sweep", "render", str(path), "--out", str(tmp_path / "run")]


# --- item 1: names that would leave their comment or value -----------------------------------

def test_1_a_model_name_with_a_newline_cannot_reach_an_exported_flags_file(tmp_path, capsys):
    """The name rode into the export's header comment raw: the line after it was live flags
    (``--load DIR --finetune``, a checkpoint unpickle)."""
    model = tmp_path / "m.yaml"
    model.write_text('name: "evil\\n--load /tmp/x --finetune"\n' + MODEL)
    err = _one_line(capsys, ["export", "--to", "megatron-lm", "--model", str(model),
                             "--system", "cpu-local", "--tp", "1", "--dp", "1",
                             "--global-batch", "4"], "U+000A")
    assert "--load" not in err  # the value is not repeated


@pytest.mark.parametrize("name", ["gpu\u202eevil", "a\x1b[2Jb", "x\u2028y"])
def test_1_a_system_name_with_bidi_escape_or_line_separator_is_refused(tmp_path, capsys, name):
    system = tmp_path / "s.yaml"
    system.write_text(CPU_LOCAL.read_text().replace("name: cpu-local",
                                                     f"name: {json.dumps(name)}"))
    _one_line(capsys, ["plan", "--model", "tiny-gpt", "--system", str(system), "--gpus", "4"],
              "is not allowed in a name")


def test_1_a_sweep_name_cannot_end_in_a_newline(tmp_path, capsys):
    """``^...$`` matched before a final newline: ``name: "x\\n"`` passed the name rule."""
    path = _sweep(tmp_path, "", name='"sweepname\\n"')
    _one_line(capsys, _render(tmp_path, path), "may hold only letters")


@pytest.mark.parametrize(("labels", "words"), [
    ('labels: {team: "a\\nb"}\n', "labels.team: character U+000A"),
    ('labels: {"bad key": x}\n', "labels may hold only letters"),
    ('labels: {note: "\\e[31mred"}\n', "U+001B"),
])
def test_1_labels_are_one_printable_line(tmp_path, capsys, labels, words):
    _one_line(capsys, _render(tmp_path, _sweep(tmp_path, labels)), words)


# --- item 2: settings that load code or move the job's files ---------------------------------

@pytest.mark.parametrize(("extra", "words"), [
    ("environment:\n  env: {LD_PRELOAD: ./evil.so}\n", "environment.env.LD_PRELOAD: ld.so"),
    ("environment:\n  env: {BASH_ENV: ./evil.sh}\n", "environment.env.BASH_ENV: bash runs"),
    ("environment:\n  env: {PYTHONSTARTUP: x.py}\n", "PYTHONSTARTUP"),
    ("environment:\n  env: {PATH: /tmp/evil}\n", "environment.env.PATH"),
    ('resources:\n  extra_sbatch: ["--export=ALL,BASH_FUNC_srun%%=x"]\n', "BASH_FUNC_"),
    ("site:\n  env: {LD_PRELOAD: ./evil.so}\n", "site.env.LD_PRELOAD"),
    ('resources:\n  extra_sbatch: ["--export=ALL,LD_PRELOAD=./evil.so"]\n',
     "extra_sbatch --export sets LD_PRELOAD"),
    ('resources:\n  extra_sbatch: ["--output=/etc/cron.d/x"]\n', "extra_sbatch --output"),
    ('resources:\n  extra_sbatch: ["-D /tmp"]\n', "extra_sbatch --chdir"),
    ('resources:\n  extra_sbatch: ["--chdir=/tmp"]\n', "extra_sbatch --chdir"),
])
def test_2_code_loading_settings_are_refused_by_default(tmp_path, capsys, extra, words):
    err = _one_line(capsys, _render(tmp_path, _sweep(tmp_path, extra)), words)
    assert "allow_unsafe" in err
    assert not (tmp_path / "run").exists()  # nothing written


def test_2_an_opt_in_is_recorded_in_every_script_and_the_manifest(tmp_path, capsys):
    path = _sweep(tmp_path, "allow_unsafe: [LD_LIBRARY_PATH, --chdir]\n"
                  "environment:\n  env: {LD_LIBRARY_PATH: /opt/lib}\n"
                  'resources:\n  extra_sbatch: ["--chdir=/tmp"]\n')
    assert main(_render(tmp_path, path)) == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["allow_unsafe"] == ["LD_LIBRARY_PATH", "--chdir"]
    scripts = list((tmp_path / "run").rglob("*.sh"))
    assert scripts
    for script in scripts:
        lines = script.read_text().splitlines()
        assert lines[0].startswith("#!")
        assert lines[1].startswith("# flm: this sweep opts in to allow_unsafe: "
                                   "LD_LIBRARY_PATH --chdir")
        assert "#SBATCH --chdir=/tmp" in lines


def test_2_an_opt_in_for_a_name_never_refused_is_a_mistake(tmp_path, capsys):
    _one_line(capsys, _render(tmp_path, _sweep(tmp_path, "allow_unsafe: [LD_PRELAOD]\n")),
              "allow_unsafe: 'LD_PRELAOD' is not set by this sweep")


# --- item 4: secrets written out in setup lines -----------------------------------------------

@pytest.mark.parametrize("line", [
    "export WANDB_API_KEY='$notavariable'",   # single quotes: a literal, $ and all
    "printf -v HF_TOKEN '%s' hf_literal",
    "printf -v HF_TOKEN 'hf_%s' \"$X\"",
])
def test_4_setup_lines_that_write_a_secret_are_refused(tmp_path, capsys, line):
    extra = "environment:\n  setup:\n    - " + json.dumps(line) + "\n"
    err = _one_line(capsys, _render(tmp_path, _sweep(tmp_path, extra)), "named like a secret")
    assert "notavariable" not in err and "hf_literal" not in err


@pytest.mark.parametrize("line", ['export WANDB_API_KEY="$WANDB_KEY_FILE_VALUE"',
                                  'printf -v HF_TOKEN "%s" "$HF_TOKEN_SOURCE"'])
def test_4_references_to_other_variables_still_pass(tmp_path, capsys, line):
    extra = "environment:\n  setup:\n    - " + json.dumps(line) + "\n"
    assert main(_render(tmp_path, _sweep(tmp_path, extra))) == 0


# --- item 5: a RUNNING row of an older flm ----------------------------------------------------

def test_5_an_old_local_id_without_host_or_start_is_never_signalled():
    """``local:PID:TOKEN`` (an older flm's id) named whatever process holds that pid now."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)
    try:
        old = f"local:{proc.pid}:tok"
        assert _same_process(old) is None
        ex = LocalExecutor()
        ex.cancel([{"scheduler_job_id": old}])
        time.sleep(0.2)
        assert proc.poll() is None  # not signalled
        seen = ex.observe(None, [{"job_key": "a", "scheduler_job_id": old}])
        assert "older flm" in seen["a"].said
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# --- item 6: a YAML alias that holds itself ---------------------------------------------------

@pytest.mark.parametrize("text", ["x: &r {self: *r}\n", "x: &r [1, *r]\n",
                                  "a: &a {b: &b {c: *a}}\n"])
def test_6_a_self_referential_alias_is_refused_in_milliseconds(tmp_path, capsys, text):
    path = tmp_path / "cycle.yaml"
    path.write_text(text)
    t0 = time.perf_counter()
    _one_line(capsys, _render(tmp_path, path), "a cycle")
    assert time.perf_counter() - t0 < 5  # it used to run until memory ran out
    model = tmp_path / "m.yaml"
    model.write_text("name: m\n" + MODEL + text)
    _one_line(capsys, ["plan", "--model", str(model), "--system", "cpu-local", "--gpus", "4"],
              "a cycle")


# --- item 8: tracebacks instead of one line ----------------------------------------------------

def test_8_a_memory_size_beyond_a_float_is_one_line(tmp_path, capsys):
    system = tmp_path / "s.yaml"
    system.write_text(CPU_LOCAL.read_text().replace("memory_bytes: 4.0e+9",
                                                     f"memory_bytes: {10**400}"))
    _one_line(capsys, ["plan", "--model", "tiny-gpt", "--system", str(system), "--gpus", "4"],
              "memory_bytes is too large")


@pytest.mark.parametrize("driver", ["postgresql+asyncpg", "postgresql+pg8000", "mysql"])
def test_8_an_unsupported_database_driver_is_one_line(capsys, driver):
    _one_line(capsys, ["results", "--db", f"{driver}://u:pw-sekrit@db.invalid/flm"],
              "is not supported")


# --- item 9: impossible measurements ------------------------------------------------------------

def _collect(tmp_path: Path, capsys, trace: dict) -> tuple[str, Path]:
    folder = tmp_path / "t"
    folder.mkdir(exist_ok=True)
    (folder / f"{trace['run_id']}.trace.json").write_text(json.dumps(trace))
    db = tmp_path / "flm.db"
    main(["collect", str(folder), "--db", f"sqlite:///{db}"])
    out, err = capsys.readouterr()
    return out + err, db


def _stored_runs(capsys, db: Path) -> list[dict]:
    assert main(["results", "--db", f"sqlite:///{db}", "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out or "[]")


@pytest.mark.parametrize(("edit", "words"), [
    (lambda t: t["summary"].update(step_time_s=1e305), "summary step_time_s 1e+305 s"),
    (lambda t: t["steps"][3].update(time_s=1e305), "step 3 time_s"),
    (lambda t: t["summary"].update(peak_memory_bytes=-5), "negative"),
    (lambda t: (t["summary"].update(mfu=7.0), t["environment"].update(device="cuda")),
     "mfu 7.0 is outside"),
    (lambda t: t["summary"].update(model_tflops_per_gpu=1e9), "above the device's peak"),
    (lambda t: t["labels"].update(big="x" * 100_000), "labels hold more than 64 KiB"),
])
def test_9_an_impossible_measurement_is_quarantined_not_stored(tmp_path, capsys, edit, words):
    trace = make_trace("bad")
    edit(trace)
    printed, db = _collect(tmp_path, capsys, trace)
    assert "1 quarantined" in printed, printed
    reason = next((tmp_path / "t" / "quarantine").glob("*.reason.txt")).read_text()
    assert words in reason, reason
    assert _stored_runs(capsys, db) == []


def test_9_a_gpu_peak_above_the_devices_memory_is_refused(tmp_path, capsys):
    """Against the shipped system's own memory (dgx-h100: 80 GB): 200 GB is no measurement."""
    trace = make_trace("big", system="dgx-h100")
    trace["environment"]["device"] = "cuda"
    trace["summary"]["peak_memory_bytes"] = 200e9
    printed, _ = _collect(tmp_path, capsys, trace)
    assert "1 quarantined" in printed
    reason = next((tmp_path / "t" / "quarantine").glob("*.reason.txt")).read_text()
    assert "above what the device holds (8.8e+10 bytes" in reason


def test_9_a_plausible_trace_is_still_stored(tmp_path, capsys):
    printed, db = _collect(tmp_path, capsys, make_trace("good"))
    assert "0 quarantined" in printed
    assert [r["run_id"] for r in _stored_runs(capsys, db)] == ["good"]


# --- item 10: absurd numbers, reserved labels, databases that should not be created ----------

@pytest.mark.parametrize(("old", "new", "words"), [
    ("fp32: 50.0e+9", "fp32: .nan", "peak_flops.fp32 must be a finite number"),
    ("fp32: 50.0e+9", "fp32: .inf", "peak_flops.fp32 must be a finite number"),
    ("gpus_per_node: 64", "gpus_per_node: 80000", "gpus_per_node must be between 1 and 64"),
    ("bandwidth: 2.0e+9", "bandwidth: .nan", "bandwidth must be a finite number"),
])
def test_10_nan_and_absurd_system_numbers_are_refused(tmp_path, capsys, old, new, words):
    system = tmp_path / "s.yaml"
    text = CPU_LOCAL.read_text()
    assert old in text
    system.write_text(text.replace(old, new, 1))
    _one_line(capsys, ["plan", "--model", "tiny-gpt", "--system", str(system), "--gpus", "4"],
              words)


@pytest.mark.parametrize("key", ["sweep", "job_key"])
def test_10_reserved_label_keys_are_refused(tmp_path, capsys, key):
    _one_line(capsys, _render(tmp_path, _sweep(tmp_path, f"labels: {{{key}: other}}\n")),
              f"labels.{key} is set by flm itself")


@pytest.mark.parametrize("argv", [["db", "version"], ["tune", "status", "some-study"]])
def test_10_a_look_at_a_mistyped_database_path_creates_nothing(tmp_path, capsys, argv):
    db = tmp_path / "mistyped.db"
    _one_line(capsys, [*argv, "--db", f"sqlite:///{db}"], "no database at")
    assert not db.exists()


def test_10_a_read_only_database_can_be_listed(tmp_path, capsys):
    printed, db = _collect(tmp_path, capsys, make_trace("r1"))
    assert "1 new" in printed or "1 inserted" in printed or "r1" not in printed
    with _tmpfs(tmp_path / "ro", "size=8m") as mnt:
        copy = mnt / "flm.db"
        copy.write_bytes(db.read_bytes())
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        runs = _stored_runs(capsys, copy)
        assert [r["run_id"] for r in runs] == ["r1"]
        assert sorted(p.name for p in mnt.iterdir()) == ["flm.db"]


def test_10_printed_names_cannot_drive_the_terminal():
    from frontier_llm.specs.values import printable, printable_path

    assert printable("run\x1b[2J\u202efdp.trace.json") == "run\\x1b[2J\\u202efdp.trace.json"
    assert printable_path(os.fsdecode(b"bad\xffname")) == "bad\\xffname"
    assert printable("plain-name.trace.json") == "plain-name.trace.json"


def test_9_calibrate_and_validate_leave_out_an_impossible_step_time_and_say_so(tmp_path, capsys):
    """A database an older flm filled (collect let a step of 1e305 s in): the refit leaves
    that run out with a warning instead of fitting through it silently."""
    import sqlite3

    folder = tmp_path / "t"
    folder.mkdir()
    shapes = [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2)]
    for i, (dp, mb) in enumerate(shapes):
        trace = make_trace(f"r{i}", dp=dp, micro_batch=mb, labels={"sweep": "cv"})
        (folder / f"r{i}.trace.json").write_text(json.dumps(trace))
    db = tmp_path / "flm.db"
    assert main(["collect", str(folder), "--db", f"sqlite:///{db}", "--quiet"]) == 0
    with sqlite3.connect(db) as conn:
        conn.execute("update flm_runs set step_time_s = 1e305 where run_id = 'r4'")
    conn.close()
    capsys.readouterr()
    assert main(["calibrate", "--from-runs", "--sweep", "cv", "--folds", "2", "--db",
                 f"sqlite:///{db}", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert "left out 1 run(s) whose step time is not plausible: r4: step time 1e+305 s" in err
    assert "r4" not in {r["run_id"] for r in json.loads(out)["runs"]}
    # flm validate's statistics leave it out too, and say so.
    assert main(["validate", "--db", f"sqlite:///{db}", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert "left out 1 run(s) whose measurement is not plausible: r4" in err
    assert {r["run_id"] for r in json.loads(out)["runs"]} == {"r0", "r1", "r2", "r3"}


# --- item 7 (second half): quarantining many files of one name --------------------------------

def test_7_quarantining_files_of_one_name_costs_linear_tries(tmp_path, monkeypatch):
    """Each of k files named alike tried name, name.1, ..., name.k: k**2/2 hard links for k
    files (3,000 took 117 s). Counted, not timed: the real os.link runs, a counter beside it."""
    from frontier_llm.store import ingest

    k = 300
    for i in range(k):
        (tmp_path / f"d{i}").mkdir()
        (tmp_path / f"d{i}" / "x.trace.json").write_text("{}")
    calls = []
    real_link = os.link
    monkeypatch.setattr(ingest.os, "link",
                        lambda *a, **kw: (calls.append(a), real_link(*a, **kw))[1])
    for i in range(k):
        assert ingest.quarantine_file(tmp_path / f"d{i}" / "x.trace.json", tmp_path, "bad")
    names = {p.name for p in (tmp_path / "quarantine").iterdir()}
    assert {"x.trace.json", "x.trace.json.1", f"x.trace.json.{k - 1}"} <= names
    assert len(calls) <= 2 * k, len(calls)


def test_8_a_trace_with_a_non_utf8_name_is_stored_and_its_neighbour_quarantined_in_words(
        tmp_path, capsys):
    """A valid trace named with a byte that is not UTF-8 ended in a traceback, and a bad one's
    reason file was lost; the name printed raw carried a terminal escape (item 10)."""
    folder = tmp_path / "t"
    folder.mkdir()
    base = os.fsencode(folder) + b"/"
    with open(base + b"good\xff.trace.json", "w") as fh:
        fh.write(json.dumps(make_trace("good")))
    bad = make_trace("bad")
    bad["summary"]["step_time_s"] = 1e305
    with open(base + b"bad\xff\x1b[2J.trace.json", "w") as fh:
        fh.write(json.dumps(bad))
    db = tmp_path / "flm.db"
    assert main(["collect", str(folder), "--db", f"sqlite:///{db}"]) == 0
    _out, err = capsys.readouterr()
    assert "\x1b" not in err and "bad\\xff\\x1b[2J.trace.json" in err, err
    [reason] = (folder / "quarantine").glob("*.reason.txt")
    assert "implausible measurement" in reason.read_text()
    assert [r["run_id"] for r in _stored_runs(capsys, db)] == ["good"]


def test_10_a_quarantine_folder_that_holds_the_collected_one_is_refused(tmp_path, capsys):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "r.trace.json").write_text(json.dumps(make_trace("r")))
    _one_line(capsys, ["collect", str(tmp_path / "t"), "--db", f"sqlite:///{tmp_path}/f.db",
                       "--quarantine", "/"], "which is being collected")


@pytest.mark.parametrize(("deadline", "words"), [("45", "give the unit: 45d (days), 45h"),
                                                 ("1e-300h", "must be at least 1h")])
def test_10_a_deadline_needs_its_unit_and_an_hour(capsys, deadline, words):
    """``--deadline 45`` was silently 45 days; ``1e-300h`` printed a 300-digit GPU count."""
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--model", "tiny-gpt", "--system", "cpu-local", "--tokens", "1e9",
              "--deadline", deadline])
    assert exit_.value.code == 2
    _out, err = capsys.readouterr()
    assert err.count("\n") == 1 and words in err and "Traceback" not in err, err


def test_8_a_nul_in_an_environment_value_is_refused_at_load(tmp_path, capsys):
    """A NUL cannot reach a process's environment: a local submit failed with its rows left
    SUBMITTING."""
    _one_line(capsys, _render(tmp_path, _sweep(tmp_path, 'environment:\n  env: {X: "a\\0b"}\n')),
              "env X: a NUL character")


def test_10_a_local_dry_run_shows_the_commands_it_would_run_not_sbatch(tmp_path, capsys):
    path = _sweep(tmp_path, "")
    assert main(["sweep", "submit", str(path), "--dry-run", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "sbatch" not in out
    assert "  one: " in out and "bench" in out


def test_10_report_plan_out_naming_a_file_is_one_line_before_planning(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    _one_line(capsys, ["report", "plan", "--model", "tiny-gpt", "--system", "cpu-local",
                       "--tokens", "1e9", "--out", str(tmp_path / "afile")],
              "is a file: flm report plan writes four files")


def test_8_ctrl_c_while_flm_starts_is_one_line(tmp_path):
    """SIGINT while the command's modules load: 'flm: interrupted', exit 130, no traceback.
    The KeyboardInterrupt is raised inside the import of the command's module, by an import
    finder a sitecustomize installs (a real SIGINT's timing cannot be aimed at start-up)."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'frontier_llm.cli.plan':\n"
        "            raise KeyboardInterrupt  # what Python's SIGINT handler raises\n"
        "sys.meta_path.insert(0, Interrupt())\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-c", "import sys; from frontier_llm.cli import main;"
                           " sys.exit(main(['plan', '--help']))"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 130 and done.stderr.strip() == "flm: interrupted", done.stderr


def test_8_a_read_only_folder_with_a_bad_trace_still_gives_its_good_ones(tmp_path, capsys):
    """One bad trace in a read-only folder stopped the collect (exit 2, nothing stored), and
    each attempt with --quarantine left one more copy there."""
    with _tmpfs(tmp_path / "ro", "size=1m") as mnt:
        (mnt / "good.trace.json").write_text(json.dumps(make_trace("good")))
        (mnt / "bad.trace.json").write_text("{not json")
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        db = tmp_path / "flm.db"
        for _ in range(2):
            assert main(["collect", str(mnt), "--db", f"sqlite:///{db}",
                         "--quarantine", str(tmp_path / "q")]) == 0
            _out, err = capsys.readouterr()
            assert "is not writable: left where it is" in err, err
        assert not (tmp_path / "q").exists() or not list((tmp_path / "q").iterdir())
        assert [r["run_id"] for r in _stored_runs(capsys, db)] == ["good"]


def test_8_a_full_disk_leaves_no_empty_database_behind(tmp_path, capsys):
    """The failed creation left a 0-byte flm.db, which the next command took for a database."""
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "r.trace.json").write_text(json.dumps(make_trace("r")))
    with _tmpfs(tmp_path / "full", "size=64k") as mnt:
        with contextlib.suppress(OSError), open(mnt / "filler", "wb") as fh:
            while True:
                fh.write(b"\0" * 4096)
                fh.flush()
        _one_line(capsys, ["collect", str(tmp_path / "t"), "--db", f"sqlite:///{mnt}/flm.db"],
                  "full")
        assert sorted(p.name for p in mnt.iterdir()) == ["filler"]


def test_10_waiting_for_a_studys_lock_is_said_at_once(tmp_path, capsys):
    """A second flm tune step of one study waited for the first in silence (20 s and more)."""
    import threading

    from frontier_llm.store import open_store
    from frontier_llm.tune.lock import study_lock

    store = open_store(f"sqlite:///{tmp_path}/flm.db")
    try:
        with study_lock(store, "s"):
            entered = threading.Event()

            def second() -> None:
                with study_lock(store, "s"):
                    entered.set()

            t = threading.Thread(target=second)
            t.start()
            deadline = time.monotonic() + 30
            while "waiting for another flm tune step" not in capsys.readouterr().err:
                assert time.monotonic() < deadline, "no word while waiting"
                time.sleep(0.05)
            assert not entered.is_set()
        t.join(30)
        assert entered.is_set()
    finally:
        store.close()


def test_10_a_layout_hash_that_is_not_its_own_is_quarantined(tmp_path, capsys):
    """The store filed a run under the trace's layout_hash on trust: a trace of one model that
    claimed another layout's hash landed in that layout's row."""
    other = make_trace("other", dp=2)
    trace = make_trace("liar")
    trace["layout_hash"] = other["layout_hash"]
    printed, db = _collect(tmp_path, capsys, trace)
    assert "1 quarantined" in printed
    reason = next((tmp_path / "t" / "quarantine").glob("*.reason.txt")).read_text()
    assert "layout_hash is not the hash of its own model, system and layout" in reason
    assert _stored_runs(capsys, db) == []
