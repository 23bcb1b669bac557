"""How long before its time limit a trainer job is signalled: long enough to save its checkpoint.

A trainer job gets the signal its trainer saves and stops on (Megatron ``--exit-signal-handler``:
SIGTERM) ``lead`` seconds before the limit. On that signal Megatron finishes the iteration it is
in, writes a checkpoint and exits (``megatron/training/training.py``, the exit-signal check
after each ``train_step``, at the Megatron-LM commit docs/export.md cites, ``309ffca``), so::

    lead = max(site's lead, checkpoint_s x SAFETY + one step + EXIT_S)

capped at :data:`CAP_FRACTION` of the walltime. ``checkpoint_s`` is the checkpoint's bytes over
the job's write bandwidth. The bytes are the cost model's own model-state accounting
(costmodel/memory.py): parameters and optimizer states, each counted once over the ranks that
share it, no gradients; Megatron's checkpoint holds the model's and the optimizer's state
(fp32 master weights and both Adam moments) and the RNG state, no gradients
(``megatron/training/checkpointing.py``: ``model_optim_rng.pt`` per tensor/pipeline rank, and
``distrib_optim.pt`` beside it for the distributed optimizer's shards; read at NVIDIA/Megatron-LM
commit 0032978f): 2 + 12 = 14 bytes per bf16 parameter, ~2.46 TB for 175B. The bandwidth is
the job's share of the site's parallel file system: min(the file system's aggregate write bandwidth,
nodes x one node's injection bandwidth) (site ``checkpoint_write_gbps`` and
``node_write_gbps``, each with its source in the system YAML). It assumes the job gets the
whole aggregate when its nodes can drive it; the file system is shared, hence :data:`SAFETY`.

Pure functions of their arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from frontier_llm.costmodel.layouts import from_configs
from frontier_llm.costmodel.memory import rank_state_bytes
from frontier_llm.specs.layout import Layout
from frontier_llm.specs.model import ModelSpec
from frontier_llm.specs.site import Site

# A stated assumption, not a measurement: the file system is shared with every other job, so a
# job may see half the aggregate its nodes could drive while it writes.
SAFETY = 2.0
# A stated assumption: after the checkpoint, the ranks tear down their process groups and the
# Python process exits (no site or trainer publishes a figure).
EXIT_S = 60.0
# At most this fraction of the walltime is held back for the checkpoint: a job that needs more
# cannot do useful work in its time (raise --time or save less).
CAP_FRACTION = 0.25


def checkpoint_bytes(model: ModelSpec, layout: Layout) -> int:
    """Bytes of one checkpoint of ``model`` trained with ``layout``: each pipeline stage's
    parameters and optimizer states per rank, times the ranks one copy is split over (the
    sharding degree of the state, times tensor parallelism)."""
    table = from_configs([layout])
    params_deg = int(table.degree("params")[0])
    optim_deg = int(table.degree("optim")[0])
    total = 0
    for stage in range(layout.pp):
        s = rank_state_bytes(model, layout, stage)
        total += (s["params_bytes"] * params_deg + s["optimizer_bytes"] * optim_deg) * layout.tp
    return total


def write_bandwidth(site: Site, nodes: int) -> float | None:
    """Bytes/s a job of ``nodes`` can write its checkpoint at (None: the site gives no
    figure)."""
    if not site.checkpoint_write_gbps:
        return None
    share = site.checkpoint_write_gbps * 1e9
    if site.node_write_gbps:
        share = min(share, nodes * site.node_write_gbps * 1e9)
    return share


@dataclass(frozen=True)
class Lead:
    """The signal's lead for one job and how it was reached."""

    seconds: int
    checkpoint_bytes: int = 0
    checkpoint_s: float = 0.0
    wanted_s: float = 0.0  # before the cap
    capped: bool = False


def lead(site_lead_s: int | None, site: Site, model: ModelSpec, layout: Layout, nodes: int,
         step_time_s: float | None, limit_s: int | None) -> Lead | None:
    """The lead of a trainer job (None: no signal at all: the site states no lead and no
    write bandwidth to size one on). ``site_lead_s`` is the site's own lead for this walltime
    (None where it states none, as LUMI and the DGX systems: the checkpoint's own lead is then
    the whole lead, since Slurm sends --signal on any site, sbatch man page, --signal);
    ``limit_s`` None is UNLIMITED."""
    bandwidth = write_bandwidth(site, nodes)
    if bandwidth is None:
        return Lead(site_lead_s) if site_lead_s else None
    site_lead_s = site_lead_s or 0
    size = checkpoint_bytes(model, layout)
    ckpt_s = size / bandwidth
    wanted = ckpt_s * SAFETY + (step_time_s or 0.0) + EXIT_S
    seconds = max(site_lead_s, math.ceil(wanted))
    capped = False
    if limit_s is not None and seconds > limit_s * CAP_FRACTION:
        seconds, capped = max(site_lead_s, int(limit_s * CAP_FRACTION)), True
    return Lead(seconds, size, ckpt_s, wanted, capped)


def cap_warning(key: str, nodes: int, limit: str, found: Lead) -> str | None:
    """One line when the cap bit: the job cannot save its checkpoint before its limit."""
    if not found.capped:
        return None
    return (f"signal lead: layout {key} ({nodes} nodes) needs {math.ceil(found.wanted_s)} s to "
            f"finish a step and save its {found.checkpoint_bytes / 1e12:.2f} TB checkpoint "
            f"({found.checkpoint_s:.0f} s of writing x {SAFETY:g} + one step + {EXIT_S:.0f} s "
            f"exit), over {CAP_FRACTION:.0%} of its --time {limit}; it is signalled "
            f"{found.seconds} s before and may be killed mid-save: raise --time or save less")
