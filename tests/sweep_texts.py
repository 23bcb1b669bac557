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


# A study's header: 4 local CPU ranks of ``model``, two steps (with {name} and {model} to fill).
STUDY_HEADER = """\
name: {name}
model: {model}
system: cpu-local
template: local
executor: local
gpus: [4]
gpus_per_node: 4
dtype: fp32
steps: 2
warmup: 1
global_batch: 8
"""

LOCAL_STUDY = STUDY_HEADER + """\
command: ["true"]
study:
  space:
{space}
    micro_batch: [1]
    zero: [0]
  objective: throughput_per_gpu
  budget: {{trials: 2}}
  sampler: tpe
  seed: 3
resources:
  time: "00:05:00"
"""


def local_study(name: str, model: str, space: list[str]) -> str:
    """A two-trial study on 4 local CPU ranks whose trials run ``true``: ``space`` lists its
    degrees' lines (``tp: [1, 2]``); micro-batch 1 and ZeRO-0 are fixed."""
    return LOCAL_STUDY.format(name=name, model=model,
                              space="\n".join(f"    {line}" for line in space))
