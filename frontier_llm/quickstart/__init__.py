"""flm quickstart: the whole loop (plan, measure, store, search, report) on one machine.

    settings   what a quickstart runs (model, ranks, layouts, steps, trials) and the folder's
               record of it, so that a second run resumes the same work or refuses another
    choose     plan the model on N CPU ranks, pick the layouts to measure and a scaling series
    files      the sweep and study files the stages run (written into the folder, readable)
    pipeline   the stages, each through the package's own APIs (planner, jobs, store, tune,
               report), resumable after Ctrl-C
    nextsteps  the commands a user runs next on a real cluster

docs/quickstart.md is the user's guide.
"""

from frontier_llm.quickstart.pipeline import Quickstart, QuickstartResult, Reporter
from frontier_llm.quickstart.settings import Settings

__all__ = ["Quickstart", "QuickstartResult", "Reporter", "Settings"]
