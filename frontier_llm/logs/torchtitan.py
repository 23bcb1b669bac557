"""torchtitan logs (``torchtitan/train.py`` through ``run_train.sh`` / torchrun).

What is read (docs/trainer-logs.md): ``Starting job: ...`` (a new run once the current one has
steps), ``Building N-D device mesh with [names], [sizes]`` or, from v0.2, ``Building device
mesh with parallelism: pp=.., dp_replicate=.., dp_shard=.., cp=.., tp=.., ep=.., etp=..`` (the
parallel degrees, cp among them), ``"context_parallel_degree": N`` of the printed job config,
``Building <model> <flavour> with ...ModelArgs(dim=..., n_layers=..., n_heads=..., n_kv_heads=...,
vocab_size=...)`` (the shape it states), ``Applied selective|full activation checkpointing``,
``Applied FSDP``, ``torchtitan version ...``, the step lines (``step: N  loss: L  [grad_norm: G]
memory: M GiB(P%)  tps: T  [tflops: F  mfu: U%]``; ``wps:`` in older versions), ``Training
completed`` and out-of-memory and error lines. The micro-batch, global batch and sequence length
are not printed: they come from ``--layout`` and ``--model``.
"""

from __future__ import annotations

import re

from frontier_llm.logs.common import (
    ParsedRun,
    Step,
    Trainer,
    integer,
    loss_number,
    number,
    read_outcome,
)

_STEP = re.compile(r"\bstep:\s*(\d+)\s+loss:\s*(\S+)(.*)")
_FIELD = re.compile(r"(memory|tps|wps|tflops|mfu):\s*([\d.,]+)\s*(GiB)?")
_MESH = re.compile(r"Building (\d+)-D device mesh with \[([^\]]*)\],\s*\[([^\]]*)\]")
# v0.2.2 (distributed/parallel_dims.py build_mesh): every degree, 1 or not, named.
_MESH_DEGREES = re.compile(r"Building device mesh with parallelism: ((?:\w+=\d+,?\s*)+)")
# The job config as ``--job.print_config`` prints it (``Running with configs: {json}``, one key a
# line): its context_parallel_degree, for a log whose mesh line is missing.
_CONFIG_CP = re.compile(r'"context_parallel_degree":\s*(\d+)')
_BUILD = re.compile(r"Building (\w+) (\S+) with \w*ModelArgs\((.*)\)")
_VERSION = re.compile(r"torchtitan version:?\s*(\S+)")
# torchtitan's mesh dimensions that are layout degrees (distributed/parallel_dims.py v0.2.2;
# older logs name the data-parallel one "dp"). Expert parallelism (ep, etp) has no layout field:
# refused in ``finish`` unless 1.
_TITAN_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


def _mesh_field(name: str) -> str | None:
    """The layout field of a mesh dimension: FSDP shards and replicates over data-parallel
    ranks (dp, dp_shard, dp_replicate: dp); pp, cp and tp are the layout's own names."""
    if name.startswith("dp"):
        return "dp" if name in ("dp", *_TITAN_DIMS) else None
    return name if name in _TITAN_DIMS else None
_MODEL_ARGS = {"dim": "hidden", "n_layers": "layers", "n_heads": "heads",
               "n_kv_heads": "kv_heads", "vocab_size": "vocab"}
GIB = 2**30


class Torchtitan(Trainer):
    name = "torchtitan"
    title = "torchtitan"
    start = re.compile(r"Starting job:")
    signature = re.compile(r"\bstep:\s*\d+\s+loss:.*\b(?:tps|wps):|Starting job:.*training"
                           r"|\[titan\]")

    def read(self, run: ParsedRun, text: str) -> bool | None:
        if m := _STEP.search(text):
            return self._step(run, m)
        if m := _MESH.search(text):
            names = [n.strip(" '\"") for n in m.group(2).split(",")]
            sizes = [integer(s, "a mesh size") for s in m.group(3).split(",") if s.strip()]
            run.args["mesh"] = ",".join(f"{n}={s}" for n, s in zip(names, sizes, strict=False))
            return True
        if m := _MESH_DEGREES.search(text):
            pairs = re.findall(r"(\w+)=(\d+)", m.group(1))
            run.args["mesh"] = ",".join(f"{n}={v}" for n, v in pairs)
            return True
        if m := _CONFIG_CP.search(text):
            run.args["config.context_parallel_degree"] = m.group(1)
            return True
        if m := _BUILD.search(text):
            run.model_name = f"{m.group(1)}-{m.group(2)}"
            for key, value in re.findall(r"(\w+)=([^,()]+)", m.group(3)):
                run.args.setdefault(f"model.{key}", value.strip())
            return True
        if "activation checkpointing" in text and "Applied" in text:
            run.args["ac"] = "selective" if "selective" in text else "full"
            return True
        if "Applied FSDP" in text or "Applied HSDP" in text:
            run.args["fsdp"] = "yes"
            return True
        if m := _VERSION.search(text):
            run.version = f"torchtitan {m.group(1)}"
            return True
        if "Starting job:" in text:
            return True
        if "Training completed" in text:
            run.finished = True
            return True
        return True if read_outcome(run, text) else None

    def _step(self, run: ParsedRun, m: re.Match) -> bool:
        fields = {k: (v, unit) for k, v, unit in _FIELD.findall(m.group(3))}
        try:
            tps = fields.get("tps") or fields.get("wps")
            if tps is None:
                return False
            tokens = number(tps[0])
            step = Step(int(m.group(1)), 0.0, loss=loss_number(m.group(2)), tokens_per_s=tokens)
            if "tflops" in fields:
                step.tflops = number(fields["tflops"][0])
            if "mfu" in fields:
                step.mfu = number(fields["mfu"][0]) / 100.0
            if "memory" in fields:
                step.memory_bytes = int(number(fields["memory"][0]) * GIB)
        except ValueError:
            return False
        run.add_step(step)
        return True

    def finish(self, run: ParsedRun) -> None:
        degrees: dict[str, int] = {}
        for pair in filter(None, run.args.get("mesh", "").split(",")):
            name, _, size = pair.partition("=")
            field = _mesh_field(name)
            if field is None and integer(size, f"mesh {name}") == 1:
                continue  # v0.2.2 names every degree: ep=1, etp=1 on a dense model
            if field is None:
                run.status, run.error = "refused", (
                    f"mesh dimension {name} (size {size}) has no flm layout field")
                continue
            degrees[field] = degrees.get(field, 1) * integer(size, f"mesh {name}")
        if "cp" not in degrees and (cp := run.args.get("config.context_parallel_degree")):
            degrees["cp"] = integer(cp, "context_parallel_degree")
        if run.args.get("mesh"):
            # The mesh line states the whole mesh: a degree it does not name is 1 (the older
            # form lists only the dimensions above 1).
            for name in _TITAN_DIMS:
                degrees.setdefault(str(_mesh_field(name)), 1)  # each of them has a field
        run.layout.update(degrees)
        if "ac" in run.args:
            run.layout["recompute"] = run.args["ac"]
        if run.args.get("fsdp"):
            run.layout["sharding"] = "zero3"  # FSDP's full sharding of params, grads, states
        run.layout["engine"] = "native"
        for key, name in _MODEL_ARGS.items():
            value = run.args.get(f"model.{key}")
            if value not in (None, "None"):
                run.model[name] = integer(value, f"model {key}")
        if "heads" in run.model and "kv_heads" not in run.model:
            run.model["kv_heads"] = run.model["heads"]
