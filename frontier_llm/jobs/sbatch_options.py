"""sbatch's short options in their long form, so ``extra_sbatch: ["-S 8"]`` renders as one
``#SBATCH --core-spec=8`` word and the site rules read every option under one name.

The table is sbatch's man page (SLURM 23.11+, OPTIONS): each one-letter option and the long
option it stands for; ``None`` marks the flags that take no value.
"""

from __future__ import annotations

import re

from frontier_llm.errors import SpecError

# short letter -> (long name, takes a value)
SHORT: dict[str, tuple[str, bool]] = {
    "A": ("account", True),
    "B": ("extra-node-info", True),
    "b": ("begin", True),
    "C": ("constraint", True),
    "c": ("cpus-per-task", True),
    "D": ("chdir", True),
    "d": ("dependency", True),
    "e": ("error", True),
    "F": ("nodefile", True),
    "G": ("gpus", True),
    "H": ("hold", False),
    "i": ("input", True),
    "J": ("job-name", True),
    "k": ("no-kill", False),
    "L": ("licenses", True),
    "M": ("clusters", True),
    "m": ("distribution", True),
    "N": ("nodes", True),
    "n": ("ntasks", True),
    "O": ("overcommit", False),
    "o": ("output", True),
    "p": ("partition", True),
    "Q": ("quiet", False),
    "q": ("qos", True),
    "S": ("core-spec", True),
    "s": ("oversubscribe", False),
    "t": ("time", True),
    "W": ("wait", False),
    "w": ("nodelist", True),
    "x": ("exclude", True),
}
_SHORT = re.compile(r"^-([A-Za-z])(?:\s*=?\s*(.*))?$", re.S)


def long_form(option: str) -> str:
    """``--name=value`` / ``--flag`` for one extra_sbatch entry (``-S 8``, ``-S8``, ``--x=y``)."""
    if option.startswith("--"):
        return option
    m = _SHORT.match(option.strip())
    if not m or m.group(1) not in SHORT:
        raise SpecError(
            "extra_sbatch: an option is '--name=value' or one of sbatch's short ones "
            "such as '-S 8' (the value is not repeated here)",
            "extra_sbatch",
        )
    name, takes_value = SHORT[m.group(1)]
    value = (m.group(2) or "").strip()
    if takes_value and not value:
        raise SpecError(
            f"extra_sbatch: -{m.group(1)} needs a value (-{m.group(1)} VALUE)", "extra_sbatch"
        )
    if not takes_value and value:
        raise SpecError(f"extra_sbatch: -{m.group(1)} takes no value", "extra_sbatch")
    return f"--{name}={value}" if takes_value else f"--{name}"
