#!/usr/bin/env bash
# On a machine with package access: download the wheels scripts/gpu-check.sh needs on a GPU node
# that has none (docs/gpu.md), into gpu-wheels/ of this checkout (ignored by git; carry or copy
# it with the checkout). What flm needs beyond a stock PyTorch environment, one pinned version
# each, --no-deps (frontier_llm/gpucheck/wheels.py lists them and says why), never torch itself.
#
#   scripts/gpu-wheels.sh [DIR]
#
# FLM_WHEELS_PYTHON_VERSION (default 3.12) and FLM_WHEELS_PLATFORM (default
# manylinux_2_28_x86_64; older manylinux tags are accepted too) describe the GPU node's Python;
# PYTHON (default python3) is the one that runs pip here.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$root/gpu-wheels}
pyver=${FLM_WHEELS_PYTHON_VERSION:-3.12}
py=${PYTHON:-python3}
platforms=(--platform "${FLM_WHEELS_PLATFORM:-manylinux_2_28_x86_64}"
    --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64)

mkdir -p "$dest"
# One version of each: two wheels of one package stop the whole install on the node.
rm -f "$dest"/*.whl
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT

mapfile -t pins < <(PYTHONPATH="$root" "$py" -m frontier_llm.gpucheck.wheels)
if ((${#pins[@]} == 0)); then
    echo "gpu-wheels: no pins from frontier_llm/gpucheck/wheels.py (is $py Python 3?)" >&2
    exit 1
fi
for line in "${pins[@]}"; do
    pin=${line%%$'\t'*}
    kind=${line##*$'\t'}
    if [[ $kind == source ]]; then
        # No wheel on PyPI (DeepSpeed): build the pure-Python one from the source, no ops
        # compiled ahead (DS_BUILD_OPS=0: the node JIT-compiles the few it uses, with nvcc).
        DS_BUILD_OPS=0 "$py" -m pip wheel -q --disable-pip-version-check --no-deps \
            --no-binary=deepspeed -w "$build" "$pin"
        mv "$build"/*.whl "$dest"/
    else
        "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
            --python-version "$pyver" --implementation cp "${platforms[@]}" -d "$dest" "$pin"
    fi
done

total=$(du -cb "$dest"/*.whl | tail -n 1 | cut -f 1)
ls -1 "$dest"
echo "gpu-wheels: $(find "$dest" -name '*.whl' | wc -l) wheels, $total bytes" \
    "($((total / 1048576)) MiB) in $dest"
