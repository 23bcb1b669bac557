"""The sweep and study files the quickstart runs: ordinary files of the kinds flm sweep and
flm tune read (docs/sweeps.md, docs/tune.md), written into the folder so the user can read,
edit and re-run them with those commands."""

from __future__ import annotations

import json
from collections.abc import Sequence

from frontier_llm.quickstart.settings import Settings
from frontier_llm.specs.forms import layout_entry
from frontier_llm.specs.layout import Layout

SWEEP_NAME = "quickstart"
STUDY_NAME = "quickstart-tune"


def _header(settings: Settings, system: str | None) -> str:
    return (f"model: {settings.model}\n"
            f"system: {system or settings.system}\n"
            "template: local\n"
            "executor: local            # jobs run as processes here; 'slurm' on a cluster\n"
            f"gpus_per_node: {settings.ranks}\n"
            "dtype: fp32\n"
            f"steps: {settings.steps}\n"
            f"warmup: {settings.warmup}\n"
            f"seed: {settings.seed}\n"
            "resources:\n"
            '  time: "00:10:00"\n')


def sweep_text(settings: Settings, layouts: Sequence[Layout], system: str | None = None) -> str:
    """One job per layout: the chosen layouts at full size and the scaling series; ``system``
    (the file that predicts, a path or a name) defaults to the settings' system."""
    lines = ["# Written by flm quickstart: the layouts its plan chose, one job each "
             "(docs/sweeps.md)",
             f"name: {SWEEP_NAME}",
             f'description: "{settings.model} on up to {settings.ranks} CPU ranks: the '
             'fastest predicted layout of each TP x PP shape, and a weak-scaling series"',
             _header(settings, system).rstrip("\n"),
             "layouts:"]
    lines += [f"  - {json.dumps(layout_entry(lay))}" for lay in layouts]
    return "\n".join(lines) + "\n"


def study_text(settings: Settings, system: str | None = None) -> str:
    """An Optuna study over the same model and ranks, warm-started by the cost model of
    ``system`` (defaults to the settings' system)."""
    divisors = [d for d in range(1, settings.ranks + 1) if settings.ranks % d == 0]
    return "\n".join([
        "# Written by flm quickstart: an Optuna study whose trials are real jobs "
        "(docs/tune.md)",
        f"name: {STUDY_NAME}",
        f'description: "{settings.model} on {settings.ranks} CPU ranks: TP x PP x micro-batch '
        'x ZeRO, model in the loop"',
        _header(settings, system).rstrip("\n"),
        f"gpus: [{settings.ranks}]",
        f"global_batch: {settings.global_batch}",
        "study:",
        "  space:",
        f"    tp: {divisors}",
        f"    pp: {divisors}",
        "    micro_batch: [1, 2]",
        "    zero: [0, 1]",
        "  objective: throughput_per_gpu",
        f"  budget: {{trials: {settings.trials}}}",
        "  sampler: tpe",
        f"  seed: {settings.seed}",
        "  in_flight: 1                # one job at a time: two would share the cores",
        f"  warm_start: {settings.warm_start}",
    ]) + "\n"
