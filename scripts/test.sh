#!/usr/bin/env bash
# The project's test command (README, .ci/run): builds the environment the README builds and
# tests in it, on a bare machine too.
#
# - Python: the virtualenv this shell has activated (VIRTUAL_ENV), else the repository's own
#   .venv, made here with python3.11 (or python3) when missing and reused after. Never the
#   system Python: it may hold packages a user's environment will not, and a test that passes
#   only because of them hides a missing requirement in setup.cfg.
# - The package with its dev extra (pip install -e ".[dev]", as the README says).
# - The system services the end-to-end tests use: a one-node SLURM and a PostgreSQL, each
#   installed from Debian's packages when missing. The tests start and stop their own instances.
# Then ruff, the import layers and the whole suite, slow end-to-end tests and each benchmark's
# quick mode included. Arguments go to pytest (bash scripts/test.sh -k quickstart).
#
# FLM_TEST_VENV=DIR builds or reuses the virtualenv in DIR instead of .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n "${VIRTUAL_ENV:-}" && -x "$VIRTUAL_ENV/bin/python" ]]; then
    venv=$VIRTUAL_ENV
else
    venv=${FLM_TEST_VENV:-.venv}
    if [[ ! -x "$venv/bin/python" ]]; then
        base=$(command -v python3.11 || command -v python3) || {
            echo "scripts/test.sh: no python3.11 or python3 on PATH" >&2; exit 1; }
        "$base" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
            echo "scripts/test.sh: $base is older than Python 3.11" >&2; exit 1; }
        echo "scripts/test.sh: making the virtualenv $venv with $base"
        "$base" -m venv "$venv"
    fi
fi
# What activating it does (bin/activate is not for scripts under set -u): its python and its
# console scripts (flm, ruff, lint-imports) come first. Tests that need flm off the PATH, as
# an HPC user calls it by its absolute path, take the venv's bin out themselves.
venv=$(cd "$venv" && pwd)
export VIRTUAL_ENV=$venv
export PATH="$venv/bin:$PATH"
unset PYTHONHOME

DS_BUILD_OPS=0 python -m pip install --quiet --disable-pip-version-check -e ".[dev]"

for script in scripts/slurm-cluster.sh scripts/postgres.sh; do
    if [[ -x "$script" ]]; then
        "$script" install
    fi
done

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
python -m ruff check .
# The import layers (.importlinter): specs -> costmodel/catalog -> planner -> bench -> store ->
# jobs -> report/tune/calibrate -> quickstart -> cli, no package importing one above it.
lint-imports
# The slowest tests are listed at the end: the suite must stay under 15 minutes on 2 cores.
# Two pytest-xdist workers (FLM_TEST_WORKERS, 0 for one process): much of the end-to-end time
# is waiting on SLURM, a daemon or a child, which the other worker fills. Each worker has its
# own SLURM cluster and PostgreSQL (tests/conftest.py). A module's tests stay on one worker
# (loadfile), so a module-scoped fixture is built once: marking groups (loadgroup) is no
# option while pytest-xdist 3.8 loses the marks under pytest 9.2 (pytest-xdist issue #1386).
# pytest-xdist hands the modules out most tests first (its default order). Measured here in one
# run each: slow end-to-end modules first (--no-loadscope-reorder) took 1,029 s against 945 s,
# two CPU-heavy modules then running side by side, and three workers 1,115 s (one timing test
# failed under that load): on two cores more workers only add contention.
# DeepSpeed's CPU comm op is built once here, not by whichever test starts DeepSpeed first
# (tests/ds_cache.py says why).
python tests/ds_cache.py >/dev/null
workers=${FLM_TEST_WORKERS:-2}
exec python -m pytest -n "$workers" --dist loadfile --durations=25 "$@"
