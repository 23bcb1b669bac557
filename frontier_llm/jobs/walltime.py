"""Will each job finish inside its time limit? Checked before anything is written or submitted.

A job needs its start-up, then ``warmup + steps`` steps at the cost model's predicted step time,
plus a margin for the prediction's error; a job asking for less than that is killed at its time
limit (TIMEOUT) after burning every node-hour it asked for, and measures nothing. So a job whose
need is over its ``--time`` is refused with one line naming the layout, the figures and what to
change, as the site rules are (docs/sites.md, "Predicted runtime against the time limit").
``--allow-overtime`` submits it anyway (bench then stops cleanly before a step it cannot finish).

A job without a predicted step time (a CPU model, a system the cost model has no figures for)
is not checked: there is nothing to compare.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from frontier_llm.errors import SpecError
from frontier_llm.specs.site import Site, time_seconds

# Start-up: importing the Python environment, building the model and setting up the first
# communicators. Anchored on the one published measurement (OLCF "sbcast your conda environment"
# guide, docs.olcf.ornl.gov/software/python/sbcast_conda.html, olcf-user-docs commit 2745903,
# 2026-07-22): a PyTorch script on 8 Frontier nodes (64 ranks) spent 51 s importing from Lustre
# (Orion); staged to the node-local NVMe it spent 39 s untarring, 3 s in conda-unpack and 2 s
# running (46 s). The guide adds that the staged route's advantage grows with the node count;
# no site publishes a larger figure, so the growth is stated, not measured: a fixed time per
# doubling of the nodes (sublinear), as a tree broadcast (sbcast), a tree/ring communicator
# bootstrap and metadata servers shared by more readers each add a level per doubling.
# From the parallel file system: 51 s + 15 s per doubling past 8 nodes (9,408 nodes: 204 s);
# staged (template_options.stage_env: sbcast to node-local storage, each node imports from its
# own disk): 46 s + 5 s per doubling (9,408 nodes: 97 s).
STARTUP_ANCHOR_NODES = 8
STARTUP_BASE_S = 51.0
STARTUP_PER_DOUBLING_S = 15.0
STAGED_BASE_S = 46.0
STAGED_PER_DOUBLING_S = 5.0
# The cost model's step times are within about 10-20 % of measured ones where it is calibrated;
# a job needs to survive the slower side.
MARGIN = 0.15


class OvertimeError(SpecError):
    """A job's predicted runtime is over its time limit."""


@dataclass(frozen=True)
class Need:
    """What one job needs: its steps at the predicted step time, start-up and margin."""

    step_time_s: float
    steps: int  # warm-up included
    nodes: int = 1
    margin: float = MARGIN
    staged: bool = False  # the Python environment staged to node-local storage (stage_env)
    # Seconds before the limit the job stops training (a trainer's signal lead: it finishes a
    # step, saves and exits then; jobs/signal_lead.py). Not scaled by the margin: it is a set
    # time, not a prediction.
    reserve_s: float = 0.0

    @property
    def startup_s(self) -> float:
        return startup_s(self.nodes, self.staged)

    @property
    def seconds(self) -> float:
        return (self.startup_s + self.steps * self.step_time_s) * (1 + self.margin) \
            + self.reserve_s

    def steps_within(self, limit_s: float) -> int:
        """The most steps that fit in ``limit_s`` with the same start-up and margin."""
        room = (limit_s - self.reserve_s) / (1 + self.margin) - self.startup_s
        return max(0, math.floor(room / self.step_time_s)) if self.step_time_s > 0 else 0


def startup_s(nodes: int, staged: bool = False) -> float:
    """Seconds a job of ``nodes`` spends before its first step (constants above: sublinear,
    lower when the environment is staged to node-local storage)."""
    doublings = max(0.0, math.log2(max(nodes, 1) / STARTUP_ANCHOR_NODES))
    if staged:
        return STAGED_BASE_S + STAGED_PER_DOUBLING_S * doublings
    return STARTUP_BASE_S + STARTUP_PER_DOUBLING_S * doublings


def longest_time(site: Site, nodes: int, partition: str | None, qos: str | None) -> str | None:
    """The longest time limit the site allows a job of ``nodes`` in its partition/QoS (None:
    no stated limit)."""
    limits = []
    for kind, name in (("partition", partition), ("qos", qos)):
        rule = site.queue(name, kind)
        if rule is not None and rule.max_time is not None:
            limits.append(rule.max_time)
    if site.bins_apply(partition):
        b = site.time_bin(nodes)
        if b is not None:
            limits.append(b.max_time)
    return min(limits, key=time_seconds) if limits else None


def _hms(seconds: float) -> str:
    s = math.ceil(seconds)
    return f"{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def steps_in(argv: Sequence[str], default: int) -> int:
    """Warm-up plus measured steps a ``flm bench`` command line runs (its last ``--steps`` and
    ``--warmup`` win, as argparse reads them; a layout's bench_args may override the sweep's)."""
    found: dict[str, int] = {}
    for flag, value in itertools.pairwise(argv):
        if flag in ("--steps", "--warmup") and str(value).isdigit():
            found[flag] = int(value)
    return found["--steps"] + found["--warmup"] if len(found) == 2 else default


def check(
    jobs: Iterable[tuple[str, int, float | None, str, int]],
    site: Site,
    partition: str | None = None,
    qos: str | None = None,
    allow_overtime: bool = False,
    staged: bool = False,
    pack: int = 1,
    reserve: Mapping[str, float] | None = None,
) -> list[tuple[str, float]]:
    """Refuse the first job whose need is over its time limit; return every checked job's
    ``(key, seconds needed)``.

    ``jobs``: (key, nodes, predicted step time or None, time limit, warm-up plus measured
    steps). ``staged``: the environment is staged to node-local storage (shorter start-up).
    ``pack``: layouts per allocation (sequential pack): ``--time`` is then each layout's, and
    the refusal says so. ``reserve``: seconds before its limit a job (by key) stops training
    (a trainer's signal lead), counted in its need.
    """
    needs = []
    for key, nodes, step_time, limit, steps in jobs:
        if not step_time:
            continue
        need = Need(float(step_time), steps, nodes, staged=staged,
                    reserve_s=(reserve or {}).get(key, 0.0))
        needs.append((key, need.seconds))
        limit_s = time_seconds(limit)
        if need.seconds <= limit_s or allow_overtime:
            continue
        fit = need.steps_within(limit_s)
        longest = longest_time(site, nodes, partition, qos)
        longer = ""
        if longest is None or time_seconds(longest) >= need.seconds:
            longer = f", a longer --time (at least {_hms(need.seconds)}"
            longer += f"; the site allows {longest})" if longest else ")"
        per = (f" (per layout: a pack of {pack} asks for {pack} x this)" if pack > 1 else "")
        raise OvertimeError(
            f"walltime: layout {key} ({nodes} nodes) needs {_hms(need.seconds)} = (start-up "
            f"{need.startup_s:.0f} s + {steps} steps x {step_time:.0f} s predicted) + "
            f"{need.margin:.0%} margin"
            + (f" + {need.reserve_s:.0f} s signal lead (checkpoint and exit)"
               if need.reserve_s else "")
            + f", over its --time {limit} ({limit_s} s){per}: run fewer "
            f"steps "
            f"({fit} fit, warm-up included), more nodes{longer}, or pass --allow-overtime",
            "time",
        )
    return needs
