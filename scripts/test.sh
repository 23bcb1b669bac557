#!/usr/bin/env bash
# The project's test command (README, .ci/run): installs everything the tests need on a bare
# machine (the package with its dev extra, and the system services the end-to-end tests use),
# then runs the whole suite, slow end-to-end tests included.
set -euo pipefail
cd "$(dirname "$0")/.."

DS_BUILD_OPS=0 python -m pip install --quiet --disable-pip-version-check -e ".[dev]"

# System services for the end-to-end tests: a one-node SLURM and a PostgreSQL, each installed
# from Debian's packages when missing. The tests start and stop their own instances.
for script in scripts/slurm-cluster.sh scripts/postgres.sh; do
    if [[ -x "$script" ]]; then
        "$script" install
    fi
done

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
python -m ruff check .
# The import layers (.importlinter): specs -> costmodel/catalog -> planner -> bench -> store ->
# jobs -> report/tune/calibrate -> cli, no package importing one above it.
lint-imports
exec python -m pytest "$@"
