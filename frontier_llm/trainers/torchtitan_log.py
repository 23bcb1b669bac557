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

from frontier_llm.specs import axes
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.model import ModelSpec
from frontier_llm.trainers.log_reader import (
    LogReader,
    ParsedRun,
    Step,
    integer,
    loss_number,
    number,
    read_outcome,
)
from frontier_llm.trainers.torchtitan_names import (
    DATA_PARALLEL,
    mesh_layout,
    recompute_of,
    sharding,
)

_STEP = re.compile(r"\bstep:\s*(\d+)\s+loss:\s*(\S+)(.*)")
_FIELD = re.compile(r"(memory|tps|wps|tflops|mfu):\s*([\d.,]+)\s*(GiB)?")
_MESH = re.compile(r"Building (\d+)-D device mesh with \[([^\]]*)\],\s*\[([^\]]*)\]")
# v0.2.2 (distributed/parallel_dims.py build_mesh): every degree, 1 or not, named.
_MESH_DEGREES = re.compile(r"Building device mesh with parallelism: ((?:\w+=\d+,?\s*)+)")
# The job config as ``--job.print_config`` prints it (``Running with configs: {json}``, one key a
# line): its context_parallel_degree, for a log whose mesh line is missing.
_CONFIG_CP = re.compile(r'"context_parallel_degree":\s*(\d+)')
_CONFIG_AC = re.compile(r'"selective_ac_option":\s*"(\w+)"')
_BUILD = re.compile(r"Building (\w+) (\S+) with \w*ModelArgs\((.*)\)")
_VERSION = re.compile(r"torchtitan version:?\s*(\S+)")
_WRAPPED = re.compile(rf"Applied ({'|'.join(DATA_PARALLEL)}) to the model")
_AC = re.compile(r"Applied (\w+) activation checkpointing")
_MODEL_ARGS = {"dim": "hidden", "n_layers": "layers", "n_heads": "heads",
               "n_kv_heads": "kv_heads", "vocab_size": "vocab"}
GIB = 2**30


class TorchtitanLog(LogReader):
    name = "torchtitan"
    title = "torchtitan"
    start = re.compile(r"Starting job:")
    # The batches and the schedule are in the job config, which it prints only with
    # --job.print_config; sequence parallelism is implied by tp (llama3/infra/parallelize.py).
    # The split over stages is in module_fqns_per_model_part (layer names), not in counts.
    unstated = ("micro_batch", "global_batch", "virtual_stages", "sequence_parallel",
                "first_stage_layers", "last_stage_layers")
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
        if m := _CONFIG_AC.search(text):
            run.args["config.selective_ac_option"] = m.group(1)
            return True
        if m := _BUILD.search(text):
            run.model_name = f"{m.group(1)}-{m.group(2)}"
            for key, value in re.findall(r"(\w+)=([^,()]+)", m.group(3)):
                run.args.setdefault(f"model.{key}", value.strip())
            return True
        if m := _AC.search(text):
            run.args["ac"] = m.group(1)
            return True
        if m := _WRAPPED.search(text):
            run.args["fsdp"] = m.group(1)
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
        mesh: dict[str, int] = {}
        for pair in filter(None, run.args.get("mesh", "").split(",")):
            name, _, size = pair.partition("=")
            mesh[name] = mesh.get(name, 1) * integer(size, f"mesh {name}")
        if "cp" not in mesh and (cp := run.args.get("config.context_parallel_degree")):
            mesh["cp"] = integer(cp, "context_parallel_degree")
        if mesh:
            degrees, refusal = mesh_layout(mesh)
            if refusal is not None:
                run.status, run.error = "refused", refusal
            if not run.args.get("mesh"):  # only the printed config's cp: nothing else is known
                degrees = {"cp": degrees["cp"]}
            run.layout.update(degrees)
        # parallelize logs its checkpointing right after the mesh, before any step, unless the
        # mode is none: a run with the mesh line and steps but no such line ran none.
        mode = run.args.get("ac") or ("none" if run.args.get("mesh") and run.steps else None)
        recompute = recompute_of(mode, run.args.get("config.selective_ac_option"))
        if recompute is not None:
            run.layout["recompute"] = str(recompute)
        if applied := run.args.get("fsdp"):
            run.layout["sharding"] = sharding(applied, mesh.get("dp_shard", 1) * mesh.get("cp", 1))
        run.layout["engine"] = "native"
        for key, name in _MODEL_ARGS.items():
            value = run.args.get(f"model.{key}")
            if value not in (None, "None"):
                run.model[name] = integer(value, f"model {key}")
        if "heads" in run.model and "kv_heads" not in run.model:
            run.model["kv_heads"] = run.model["heads"]

    def step_times(self, run: ParsedRun, layout: Layout, model: ModelSpec) -> None:
        """tps counts the tokens of one data-parallel rank's batch over the time and the
        cp x tp x pp GPUs that share it (components/metrics.py divides by
        parallel_dims.non_data_parallel_size = cp * tp * pp; v0.2.2)."""
        for s in run.steps:
            if not s.time_s and s.tokens_per_s:
                tokens = layout.global_batch // layout.dp * model.seq_len
                s.time_s = tokens / (s.tokens_per_s * axes.model_parallel_size(layout))
