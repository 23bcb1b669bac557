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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from frontier_llm.errors import SpecError
from frontier_llm.specs.site import Site, time_seconds

# Stated, not measured: importing the Python environment, building the model and setting up the
# first communicators, a minute plus a second per node (imports from the parallel file system
# slow down with the nodes reading at once: OLCF's PyTorch guide recommends sbcast staging for
# it; no site publishes a figure). 16 nodes: 76 s; 384 nodes: 7.4 minutes.
STARTUP_BASE_S = 60.0
STARTUP_PER_NODE_S = 1.0
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

    @property
    def startup_s(self) -> float:
        return STARTUP_BASE_S + STARTUP_PER_NODE_S * self.nodes

    @property
    def seconds(self) -> float:
        return (self.startup_s + self.steps * self.step_time_s) * (1 + self.margin)

    def steps_within(self, limit_s: float) -> int:
        """The most steps that fit in ``limit_s`` with the same start-up and margin."""
        room = limit_s / (1 + self.margin) - self.startup_s
        return max(0, math.floor(room / self.step_time_s)) if self.step_time_s > 0 else 0


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
) -> list[tuple[str, float]]:
    """Refuse the first job whose need is over its time limit; return every checked job's
    ``(key, seconds needed)``.

    ``jobs``: (key, nodes, predicted step time or None, time limit, warm-up plus measured
    steps).
    """
    needs = []
    for key, nodes, step_time, limit, steps in jobs:
        if not step_time:
            continue
        need = Need(float(step_time), steps, nodes)
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
        raise OvertimeError(
            f"walltime: layout {key} ({nodes} nodes) needs {_hms(need.seconds)} = (start-up "
            f"{need.startup_s:.0f} s + {steps} steps x {step_time:.0f} s predicted) + "
            f"{need.margin:.0%} margin, over its --time {limit} ({limit_s} s): run fewer steps "
            f"({fit} fit, warm-up included), more nodes{longer}, or pass --allow-overtime",
            "time",
        )
    return needs
