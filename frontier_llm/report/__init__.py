"""Reports: weak- and strong-scaling efficiency, per-layout and error tables, and their figures.

Pure functions from DataFrames to tables (:mod:`.scaling`, :mod:`.layouts`, :mod:`.errors`) and
from tables to matplotlib figures (:mod:`.figures`, all in the one style of :mod:`.style`); the
input frames come from the store (measured) or from a sweep file and the cost model
(:mod:`.frames`). Writing files is :mod:`.tables` and :func:`.style.save`; the ``flm report``
command and the scripts in ``analysis/`` only wire these together. See docs/report.md.
"""

from frontier_llm.report.errors import errors_table
from frontier_llm.report.frames import layout_rows, sweep_frame, with_measurements
from frontier_llm.report.layouts import knob_table, layouts_table, memory_breakdown
from frontier_llm.report.scaling import scaling_table

__all__ = ["errors_table", "knob_table", "layout_rows", "layouts_table", "memory_breakdown",
           "scaling_table", "sweep_frame", "with_measurements"]
