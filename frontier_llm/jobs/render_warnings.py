"""What a rendered sweep may waste without being wrong: one line each, shown by ``flm sweep
render`` and ``submit`` (and kept in the manifest's ``warnings``), never a refusal.

* ``pack:`` above 1 that packed nothing: every layout still takes an allocation of its own
  (a site that charges whole nodes bills 7/8 of each node idle for one-GCD layouts).
* one-node layouts smaller than a node, several of them, without ``pack:`` on a site that
  bills whole nodes: each takes a node of its own (Frontier charges nodes requested x time,
  whatever the job uses of them: OLCF Frontier user guide, "Node-Hour Calculation").
* the sweep folder (``--out``: logs, traces, the model files every rank reads) outside the
  site's parallel file system: on Frontier the home and project folders are NFS, and the OLCF
  guide "strongly recommend[s]" running jobs from Lustre Orion instead (Frontier user guide,
  "NFS Filesystem" note).

Pure functions of their arguments.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from frontier_llm.jobs.walltime import startup_s
from frontier_llm.jobs.workload import JOB_DIR


def pack_warnings(pack: int, mode: str, groups: Iterable[tuple[str, int, int, int]]
                  ) -> list[str]:
    """``groups``: (name, layouts, layouts per allocation, nodes) of each script. One line per
    group that ``pack`` > 1 did not pack, saying why."""
    if pack <= 1:
        return []
    out = []
    for name, size, per, nodes in groups:
        if per > 1:
            continue
        if size == 1:
            why = "it holds one layout"
        elif mode == "concurrent" and nodes > 1:
            why = (f"its layouts span {nodes} nodes, and pack_mode concurrent packs one-node "
                   "layouts only")
        else:
            why = "its layouts do not fit side by side on one node"
        out.append(f"pack: {pack} packed nothing in {name} ({size} layout(s), one allocation "
                   f"each): {why}")
    return out


def sub_node_warnings(pack: int, groups: Iterable[tuple[str, int, int, int, int, bool]],
                      node_gpus: int, concurrent_ok: bool, site_name: str) -> list[str]:
    """``groups``: (name, layouts, nodes, ranks per node, time limit in s, billed whole) of
    each script. One line per group of two or more one-node layouts that leave GPUs of their
    node idle, on a node billed whole, when the sweep sets no ``pack:``: the node-hours at
    their time limits, against those of the packed sweep, and the lines to add. Packing is
    not done for the user: side-by-side steps share an allocation's fate (a cancel or a node
    failure ends them all) and its time bin, which a sweep should choose (docs/sweeps.md)."""
    if pack > 1:
        return []
    out = []
    for name, size, nodes, rpn, seconds, whole in groups:
        if not whole or nodes != 1 or size < 2 or rpn >= node_gpus:
            continue
        per = node_gpus // rpn
        now, packed = size * seconds / 3600, -(-size // per) * seconds / 3600
        how = (f"add `pack: {per}` and `pack_mode: concurrent` to the sweep file to run {per} "
               f"side by side a node: {packed:,.1f} node-hours" if concurrent_ok else
               "pack_mode concurrent is refused here (launcher or binding), so use a "
               "partition that shares nodes, if the site has one")
        out.append(f"{name}: {size} one-node layouts of {rpn} of a node's {node_gpus} GPUs "
                   f"take {size} whole {site_name} nodes (billed per node, whatever the job "
                   f"uses): up to {now:,.1f} node-hours at their time limit, "
                   f"{now - packed:,.1f} of them on idle GPUs; {how}")
    return out


def out_warning(directory: Path, parallel_fs: Sequence[str], site_name: str,
                source: str = "") -> str | None:
    """A line when ``directory`` lies under none of the site's parallel file systems (empty
    list: the site names none, nothing to say)."""
    if not parallel_fs:
        return None
    resolved = str(directory)
    for root in parallel_fs:
        root = root.rstrip("/")
        if resolved == root or resolved.startswith(root + "/"):
            return None
    cite = f" (source: {source})" if source else ""
    return (f"--out {directory} is not on {site_name}'s parallel file system "
            f"({', '.join(parallel_fs)}): every rank reads the model files and writes logs and "
            f"traces there; render into a folder under one of them{cite}")


# Node-hours a start may save before staging is worth a line: a stated threshold (at Frontier's
# figures, about 512 nodes), below which the set-up of staging is not worth the user's time.
STAGING_HINT_NODE_HOURS = 10.0


def staging_warning(jobs: Iterable[tuple[str, int]], stage_dir: str | None, staged: bool,
                    site_name: str) -> str | None:
    """A line when the site offers node-local staging (``stage_dir``), the sweep does not use
    it, and its largest job would save at least :data:`STAGING_HINT_NODE_HOURS` a start by it
    (jobs/walltime.py's start-up from the parallel file system against staged): at 9,408
    Frontier nodes, 204 s against 97 s, about 280 node-hours every start."""
    if not stage_dir or staged:
        return None
    key, nodes = max(jobs, key=lambda kn: kn[1], default=("", 0))
    if not nodes:
        return None
    plain, fast = startup_s(nodes), startup_s(nodes, staged=True)
    saved = (plain - fast) * nodes / 3600
    if saved < STAGING_HINT_NODE_HOURS:
        return None
    return (f"start-up: layout {key} ({nodes:,} nodes) is predicted to import its environment "
            f"from the parallel file system for {plain:.0f} s, {fast:.0f} s staged to each "
            f"node's local storage ({stage_dir}): {saved:,.0f} node-hours every start; "
            "template_options.stage_env stages a packed environment (docs/sites.md, OLCF's "
            f"sbcast guide for {site_name})")


def _looks_like_path(word: str) -> bool:
    # A word holding {job_dir} (workload.JOB_DIR, replaced in each rank's shell) names a path
    # the job makes, not one to find here.
    return not word.startswith("-") and "=" not in word and JOB_DIR not in word and (
        "/" in word or word.endswith((".py", ".sh")))


def command_paths(command: Sequence[str], out: Path, sweep_dir: Path
                  ) -> tuple[tuple[str, ...], list[str]]:
    """``workload_command`` as the job runs it, and a warning per relative file path in it
    that the job would not find. The job's working directory is the sweep folder (``out``:
    sbatch --chdir), so a relative path found there stays; one found beside the sweep file
    instead is made absolute (the file its author meant); one found in neither is kept and
    warned about: its rank would stop at its first line."""
    words, warnings = [], []
    for word in command:
        if not _looks_like_path(word) or Path(word).is_absolute() or (out / word).exists():
            words.append(word)
            continue
        beside = (sweep_dir / word).resolve()
        if beside.exists():
            words.append(str(beside))
            continue
        words.append(word)
        warnings.append(f"workload_command names {word}, which is neither in --out {out} "
                        f"(the job's working directory) nor beside the sweep file in "
                        f"{sweep_dir}: give its absolute path on the cluster")
    return tuple(words), warnings
