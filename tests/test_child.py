"""No child process flm starts depends on the folder it is started from.

The usual set-up clones the repository into ``~`` (a folder named ``frontier_llm``) and works
from ``~``. ``python -m frontier_llm...`` put that folder first on the child's import path, and
with an editable install the child imported it as an empty namespace package and died
(``cannot import name '__version__'``). Every test here starts real children, from a folder
holding such a directory, through the code flm uses to start them. The whole quickstart from
such a folder, by flm's entry point, is the end-to-end test in tests/test_quickstart.py (one loop
for both checks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from frontier_llm.child import flm, python_module

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A folder like ``~`` after ``git clone``: it holds a directory named frontier_llm that is
    not the package (a clone's top level has no __init__.py). The test runs from it."""
    clone = tmp_path / "frontier_llm"
    (clone / "docs").mkdir(parents=True)
    (clone / "README.md").write_text("# frontier_llm\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return tmp_path


def test_a_plain_python_dash_m_imports_the_installation_too(home):
    """Without -P the child has the folder first on its path. Under setuptools' finder-based
    editable install it imported the clone's folder and died on ``__version__``; setup.cfg's
    ``package_dir`` gives a plain .pth install, under which the regular package wins. flm's own
    children keep -P (a wheel or another installer may still differ)."""
    proc = subprocess.run([sys.executable, "-m", "frontier_llm.cli", "--version"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("frontier_llm ")


def test_flm_child_imports_the_installation(home):
    proc = subprocess.run(flm(["--version"]), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("frontier_llm ")
    module = subprocess.run(python_module("frontier_llm.logs.job", ["--help"]),
                            capture_output=True, text=True, timeout=120)
    assert module.returncode == 0, module.stderr


def test_local_sweep_jobs_start_the_installation(home):
    """The local executor's command (``flm`` in a sweep file) as a job runs it."""
    from frontier_llm.jobs.executors import local_command

    proc = subprocess.run(local_command(["flm", "--version"]), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_bench_ranks_start_from_any_folder(home):
    """``flm bench`` without a launcher starts its ranks itself (bench/launch.py)."""
    from frontier_llm.bench.launch import spawn_local

    assert spawn_local(["--help"], 2) == [0, 0]


def test_calibration_ranks_start_from_any_folder(home):
    """``flm calibrate run``'s ranks (calibrate/local.py)."""
    from frontier_llm.calibrate.local import spawn

    assert spawn(["--help"], 2, use_mpi=False, timeout_s=120) == 0


def test_job_scripts_and_submitted_workers_leave_the_folder_out():
    """What runs on a cluster node (no cluster here): the log-to-trace command a trainer's job
    runs after the trainer, and the worker of flm calibrate submit, both with -P."""
    from frontier_llm.jobs.workload import AFTER_COMMAND

    assert AFTER_COMMAND[:3] == ("python3", "-P", "-m")
    assert flm(["calibrate", "worker"])[1:4] == ["-P", "-m", "frontier_llm.cli"]


def test_no_module_starts_python_dash_m_by_hand():
    """Every child goes through frontier_llm/child.py: no other module spells the argv."""
    offenders = []
    for path in (ROOT / "frontier_llm").rglob("*.py"):
        if path.name == "child.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if '"-m"' in code or "'-m'" in code:
                offenders.append(f"{path.relative_to(ROOT)}:{n}")
    assert not offenders, offenders


def test_a_notebook_kernel_started_in_the_clones_parent_uses_the_api(home):
    """A Jupyter kernel started in the clone's parent (a notebook kept in ``~``): the real
    ipykernel, started by nbclient as Jupyter starts it, puts that folder first on its import
    path, with no ``-P``. The package's API must be the installation's, not the clone's folder
    imported as an empty namespace package (``frontier_llm.plan`` raised AttributeError)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(
        "import os, frontier_llm as flm\n"
        "print('cwd', os.getcwd())\n"
        "print('file', flm.__file__)\n"
        "p = flm.plan(model='gpt-22b', system='frontier', gpus=64, top=1)\n"
        "print('rows', len(p))"))
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(home)}}).execute()
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert f"cwd {home}" in text
    assert f"file {ROOT / 'frontier_llm' / '__init__.py'}" in text
    assert "rows 1" in text
