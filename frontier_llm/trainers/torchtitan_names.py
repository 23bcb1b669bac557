"""torchtitan's words for flm's layout, written once: the exporter (``trainers/torchtitan.py``)
writes the job-config keys from this table and the log reader (``trainers/torchtitan_log.py``)
reads the logged mesh and activation-checkpointing lines back through it.

Sources (torchtitan v0.2.2, 73a0e69): ``config/job_config.py`` (the ``[parallelism]`` keys,
``activation_checkpoint.mode``), ``train.py`` (``ParallelDims(dp_shard=..., ep=
parallelism_config.expert_parallel_degree, etp=...expert_tensor_parallel_degree)``),
``distributed/parallel_dims.py`` (``build_mesh`` logs ``Building device mesh with parallelism:
pp=.., dp_replicate=.., dp_shard=.., cp=.., tp=.., ep=.., etp=..``; ``_validate`` asserts
``etp == tp or etp == 1`` when ep > 1), ``distributed/activation_checkpoint.py`` (``Applied
{mode} activation checkpointing to the model``), ``models/llama3/infra/parallelize.py``
(``Applied FSDP|HSDP to the model``).
"""

from __future__ import annotations

from dataclasses import dataclass

from frontier_llm.specs.layout import Recompute


@dataclass(frozen=True)
class Degree:
    """One of torchtitan's parallel degrees: the layout field it is part of, its job-config
    key (``[parallelism]``) and its name on the logged mesh line."""

    field: str
    key: str
    mesh: str


# Every degree of the mesh line, in its order. dp is dp_replicate x dp_shard (HSDP: replicas of
# shard groups); the others are the layout's own fields.
DEGREES = (
    Degree("pp", "pipeline_parallel_degree", "pp"),
    Degree("dp", "data_parallel_replicate_degree", "dp_replicate"),
    Degree("dp", "data_parallel_shard_degree", "dp_shard"),
    Degree("cp", "context_parallel_degree", "cp"),
    Degree("tp", "tensor_parallel_degree", "tp"),
    Degree("ep", "expert_parallel_degree", "ep"),
)
# The experts' tensor parallelism, flm's etp (specs/axes.py: stored 0 where it is tp). v0.2.2
# runs "etp = tp" or "etp = 1" (job_config.py), only with ep > 1 ("No effect ... when ep = 1":
# its experts then follow tp); its default is 1, so the export always writes it.
EXPERT_TP = Degree("etp", "expert_tensor_parallel_degree", "etp")
BY_MESH = {d.mesh: d for d in (*DEGREES, EXPERT_TP)}
# Before v0.2 the mesh line named only the dimensions above 1, the data-parallel one "dp".
OLD_MESH = {"dp": "dp"}

# activation_checkpoint.mode for each recomputation flm exports to torchtitan; selective is
# op-level (selective_ac_option = "op"), flm's selective-op.
AC_MODES = {Recompute.NONE: "none", Recompute.FULL: "full", Recompute.SELECTIVE_OP: "selective"}
SELECTIVE_OPTION = "op"


def recompute_of(mode: str | None, option: str | None) -> Recompute | None:
    """The recomputation a logged mode (and the printed config's ``selective_ac_option``)
    states; None when it states none flm has. "selective" alone is op-level or every N-th
    layer (its default option is "2"): only the printed option says which."""
    if mode == AC_MODES[Recompute.SELECTIVE_OP]:
        return Recompute.SELECTIVE_OP if option == SELECTIVE_OPTION else None
    return next((r for r, m in AC_MODES.items() if m == mode), None)


def key(mesh: str) -> str:
    """The job-config key of a mesh dimension."""
    return BY_MESH[mesh].key


def mesh_layout(mesh: dict[str, int]) -> tuple[dict[str, int], str | None]:
    """The layout degrees a logged mesh states, and the reason it is no flm layout (None when
    it is one). A degree the line does not name is 1 (the older line names only those above
    1)."""
    degrees: dict[str, int] = {}
    for name, size in mesh.items():
        d = BY_MESH.get(name)
        field = OLD_MESH.get(name) or (d.field if d is not None and d is not EXPERT_TP else None)
        if name == EXPERT_TP.mesh:
            continue
        if field is None:
            if size == 1:
                continue
            return degrees, f"mesh dimension {name} (size {size}) has no flm layout field"
        degrees[field] = degrees.get(field, 1) * size
    for d in DEGREES:
        degrees.setdefault(d.field, 1)
    # A line without etp (before v0.2) ran its experts at tp; with ep 1 etp has no effect.
    etp = mesh.get(EXPERT_TP.mesh, degrees["tp"])
    degrees[EXPERT_TP.field] = etp if degrees["ep"] > 1 and etp != degrees["tp"] else 0
    return degrees, None


# How the data-parallel wrapping it logs ("Applied FSDP|HSDP|DDP to the model") shards:
# fully_shard shards parameters, gradients and optimizer states together, over the dp_shard x
# cp ranks (parallel_dims.py fsdp); HSDP replicates those shard groups; DDP shards nothing.
DATA_PARALLEL = ("FSDP", "HSDP", "DDP")


def sharding(applied: str, shard_group: int) -> str:
    """The flm sharding of the logged data-parallel wrapping over ``shard_group`` ranks."""
    if applied == "HSDP":
        return ",".join(f"{c}=partial:{shard_group}" for c in ("p", "g", "o"))
    return "zero0" if applied == "DDP" else "zero3"
