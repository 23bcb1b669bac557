"""Sweep files the tests write: tiny-gpt on CPU ranks run by the local executor (one header,
so a change to what a sweep needs is made once)."""

from __future__ import annotations

LOCAL_HEADER = """\
name: {name}
model: tiny-gpt
system: cpu-local
executor: local
gpus_per_node: 4
dtype: fp32
steps: 2
warmup: 1
global_batch: 4
"""


def local_sweep(name: str, layouts: list[str], extra: str = "") -> str:
    """A local tiny-gpt sweep: ``layouts`` are flow-style YAML maps, ``extra`` more top-level
    lines (ending in a newline) between the header and the layouts."""
    return (LOCAL_HEADER.format(name=name) + extra + "layouts:\n"
            + "".join(f"  - {x}\n" for x in layouts))
