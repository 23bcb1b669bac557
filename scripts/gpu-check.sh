#!/usr/bin/env bash
# The GPU check (docs/gpu.md): measures flm on one real GPU in at most eight minutes of wall
# time, on a node with no network, and writes at most 8 files to OUTDIR (summary.json,
# summary.md, the traces, the calibration and its fitted system file, the log).
#
#   scripts/gpu-check.sh OUTDIR          # on the GPU node
#   scripts/gpu-check.sh --tiny OUTDIR   # the same steps on a CPU, tiny (the tests run this)
#
# The checkout is put on the path as it is (no pip install: the project must run on the
# image's own torch, whatever setup.cfg pins); the wheels scripts/gpu-wheels.sh downloaded go to
# a temporary site beside it. Each step runs under its own timeout, inside one budget; a step
# that fails or runs out of time is recorded and the next one runs.
# Exit: 0 every step passed; 1 the summary lists failures; 2 refused (no CUDA, bad usage);
# 3 no summary could be written.
#
# Environment: FLM_PYTHON (default /opt/torch/.venv/bin/python3 where it exists, else python3),
# FLM_GPU_WHEELS (default gpu-wheels/ of this checkout), FLM_GPU_CHECK_BUDGET (seconds, default
# 470), FLM_GPU_SYSTEM (the catalog system or YAML file to measure against; default: the
# single-GPU system of the device's name), FLM_GPU_CHECK_WORK (keep the work folder there).
set -uo pipefail  # no -e: a failing step is a finding, not the end of the check

root=$(cd "$(dirname "$0")/.." && pwd)
tiny=()
if [[ ${1:-} == --tiny ]]; then
    tiny=(--tiny)
    shift
fi
if [[ $# -ne 1 || ${1:-} == -* ]]; then
    echo "usage: scripts/gpu-check.sh [--tiny] OUTDIR" >&2
    exit 2
fi
out=$1

py=${FLM_PYTHON:-}
if [[ -z $py ]]; then
    if [[ -x /opt/torch/.venv/bin/python3 ]]; then
        py=/opt/torch/.venv/bin/python3  # the lent GPU machines' PyTorch (docs/gpu.md)
    else
        py=$(command -v python3 || true)
    fi
fi
if [[ -z $py ]]; then
    echo "gpu-check: needs python3 with PyTorch (on PATH, or FLM_PYTHON)" >&2
    exit 2
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

# Refuse at once, in one line, where the mode cannot run (the GPU mode without CUDA).
"$py" -m frontier_llm.gpucheck require ${tiny[@]+"${tiny[@]}"} || exit 2

start=$SECONDS
budget=${FLM_GPU_CHECK_BUDGET:-470}
summary_s=25  # kept back for the summary
if [[ -n ${FLM_GPU_CHECK_WORK:-} ]]; then
    work=$FLM_GPU_CHECK_WORK
    mkdir -p "$work"
else
    work=$(mktemp -d "${TMPDIR:-/tmp}/flm-gpucheck.XXXXXX")
    trap 'rm -rf "$work"' EXIT
fi
: >"$work/steps.tsv"

wheels=${FLM_GPU_WHEELS:-$root/gpu-wheels}
if compgen -G "$wheels/*.whl" >/dev/null; then
    # --no-deps --no-index: nothing is resolved or fetched, and torch is never touched.
    if timeout 90 "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --disable-pip-version-check --target "$work/site" "$wheels"/*.whl \
        >"$work/wheels.log" 2>&1; then
        export PYTHONPATH="$root:$work/site${PYTHONPATH#"$root"}"
    else
        # Recorded by the preflight step, which lists every requirement it cannot import.
        echo "gpu-check: installing $wheels failed: $(tail -n 1 "$work/wheels.log")" >&2
    fi
    cat "$work/wheels.log" >>"$work/check.log"
fi

step() {  # step NAME LIMIT_S: run one step under its limit, cut to what the budget has left
    local name=$1 limit=$2 left t0 rc
    left=$((budget - (SECONDS - start) - summary_s))
    ((limit > left)) && limit=$left
    if ((limit < 10)); then
        printf '%s\t%s\t%s\t%s\n' "$name" 125 "$limit" 0 >>"$work/steps.tsv"
        echo "gpu-check: $name skipped (the budget is spent)" >&2
        return
    fi
    t0=$SECONDS
    timeout -k 10 "$limit" "$py" -m frontier_llm.gpucheck "$name" --work "$work" \
        --limit "$limit" ${tiny[@]+"${tiny[@]}"} >"$work/$name.log" 2>&1
    rc=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$limit" "$((SECONDS - t0))" >>"$work/steps.tsv"
    {
        echo "=== step $name: exit $rc after $((SECONDS - t0)) s (limit $limit s)"
        cat "$work/$name.log"
    } >>"$work/check.log"
    echo "gpu-check: $name exit $rc after $((SECONDS - t0)) s (limit $limit s)" >&2
}

# Limits sized for gpt3-1.3b on one H100/H200 (docs/gpu.md): the first five add up to the
# budget less the summary's share; a step that needs less gives the rest to the ones after it.
step preflight 40
step mfu 110
step memory 150
step calibrate 45
step deepspeed 100
# SDPA's own rate at a context-parallel rank's call shapes (seconds of kernels; most of the
# limit is importing torch).
step attention 30
# Last: fp8 (torchao float8 beside bf16) takes what the budget has left, skipped when none.
step fp8 90

left=$((budget - (SECONDS - start)))
((left < 10)) && left=10
timeout -k 5 "$left" "$py" -m frontier_llm.gpucheck summarize --work "$work" --out "$out" \
    --total-limit "$budget" ${tiny[@]+"${tiny[@]}"} >>"$work/check.log" 2>&1
rc=$?
if [[ ! -f $out/summary.json ]]; then
    echo "gpu-check: no summary written (exit $rc): $(tail -n 1 "$work/check.log")" >&2
    exit 3
fi
echo "gpu-check: $out/summary.md after $((SECONDS - start)) s" >&2
exit "$rc"
