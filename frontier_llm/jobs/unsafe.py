"""What a sweep (or a system file that is not shipped) may hand a job's environment and sbatch,
as allow-lists; anything else only by name under ``allow_unsafe:``, an opt-in the terminal, the
rendered scripts and the manifest all show.

A sweep's values are shell-quoted, so they arrive as data (docs/sweeps.md "Security"); but some
variables are read by the programs the job starts as *instructions*: a library to load into
every process, a file of shell to run first, where to look for programs. The set of such
variables is open (each runtime, launcher and plugin adds its own: srun's
``SLURM_TASK_PROLOG``, Python's ``PYTHONPYCACHEPREFIX``, ROCm's ``HSA_TOOLS_LIB``, CUDA's
``CUDA_INJECTION64_PATH``), so a list of bad names always misses one. Instead a sweep may set
the variables of a few documented families that tune the collective and GPU runtimes, minus
each name of them that points at a file to load; and sbatch options from a list of full names
(sbatch, like getopt_long(3), obeys any unambiguous prefix of a long option: ``--ch=`` is
``--chdir``, so a name is compared whole, never by prefix). Nothing here repeats a value.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from frontier_llm.errors import SpecError

# A variable name, the whole string (``\A...\Z``: ``$`` also matches before a final newline,
# and a name ending in one split ``export NAME`` from ``=VALUE`` in the job script).
ENV_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")

# Families a sweep may set without opting in: prefix -> what reads them (their own docs).
FAMILIES: dict[str, str] = {
    "NCCL_": "NCCL/RCCL collectives (NCCL docs, Environment Variables)",
    "RCCL_": "RCCL collectives (ROCm RCCL docs, Environment variables)",
    "TORCH_NCCL_": "PyTorch's NCCL process group (torch.distributed docs)",
    "FI_": "libfabric providers, e.g. CXI on Slingshot (fi_cxi(7))",
    "CXI_": "the CXI driver's fork safety (fi_cxi(7))",
    "MPICH_": "Cray MPICH (intro_mpi(3))",
    "HSA_": "the ROCm runtime (ROCm docs, HIP environment variables)",
    "HIP_": "the HIP runtime (ROCm docs, HIP environment variables)",
    "ROCR_": "the ROCm runtime's device selection (ROCm docs)",
    "MIOPEN_": "MIOpen (MIOpen docs, environment variables)",
    "CUDA_": "the CUDA runtime (CUDA C Programming Guide, CUDA Environment Variables)",
    "PYTORCH_": "PyTorch's allocators (torch.cuda docs, memory management)",
    "OMP_": "OpenMP threads and binding (OpenMP 5.2, Environment Variables)",
    "GLOO_": "the gloo process group (torch.distributed docs)",
    "NVTE_": "Transformer Engine (its docs, environment variables)",
    "SWEEP_": "the sweep's own command (no program outside it reads them)",
}
NAMES: dict[str, str] = {
    "TOKENIZERS_PARALLELISM": "Hugging Face tokenizers",
    "MKL_NUM_THREADS": "Intel MKL threads",
    "OPENBLAS_NUM_THREADS": "OpenBLAS threads",
    "TORCH_DISTRIBUTED_DEBUG": "torch.distributed's checks (torch.distributed docs)",
    "MIOPEN_USER_DB_PATH": "MIOpen's tuning database (data: MIOpen docs, Kernel cache)",
}
# A last word of a family's variable that names a file or folder to load from or write to
# (NCCL_NET_PLUGIN, HSA_TOOLS_LIB, OMP_TOOL_LIBRARIES, CUDA_INJECTION64_PATH, FI_PROVIDER_PATH,
# CUDA_CACHE_PATH's compiled kernels, NCCL_CONF_FILE's settings): refused in every family but
# the sweep's own, whose variables nothing else reads.
_LOADS = re.compile(r"_(PLUGIN|PLUGINS|LIB|LIBS|LIBRARY|LIBRARIES|PATH|PATHS|DIR|DIRS|FILE|"
                    r"FILES|PRELOAD|CONF|PREFIX|HOME|ROOT)\Z")

# Why some common names are refused, for a message that says more than "not on the list".
VARIABLES: dict[str, str] = {
    "LD_PRELOAD": "ld.so loads these libraries into every program (ld.so(8))",
    "LD_AUDIT": "ld.so loads these auditing libraries into every program (ld.so(8))",
    "LD_LIBRARY_PATH": "ld.so looks here first for every shared library (ld.so(8))",
    "BASH_ENV": "bash runs this file before a non-interactive script (bash(1), INVOCATION)",
    "ENV": "sh and bash in POSIX mode run this file at start-up (bash(1), INVOCATION)",
    "PATH": "decides which program each command name runs (bash(1), COMMAND EXECUTION)",
    "PYTHONSTARTUP": "Python runs this file at start-up (python(1), ENVIRONMENT)",
    "PYTHONPATH": "Python imports modules from here first (python(1), ENVIRONMENT)",
    "PYTHONPYCACHEPREFIX": "Python loads compiled bytecode from here (python(1))",
    "SLURM_TASK_PROLOG": "srun runs this program before each task (srun(1))",
    "SRUN_EXPORT_ENV": "srun exports these variables to each task (srun(1))",
    "TORCH_EXTENSIONS_DIR": "PyTorch and DeepSpeed load compiled extensions from here",
}

# sbatch options a sweep may pass in extra_sbatch, by full long name (sbatch(1), OPTIONS):
# where, when and on what the job runs, and how it is accounted. Left out: the ones flm writes
# itself (--nodes, --time, --job-name, --array...), those below, and those that read or write
# files (--nodefile, --wrap, --uid).
SBATCH_ALLOWED = frozenset({
    "account", "acctg-freq", "begin", "clusters", "cluster-constraint", "comment",
    "constraint", "contiguous", "core-spec", "cores-per-socket", "cpu-freq", "cpus-per-gpu",
    "cpus-per-task", "deadline", "delay-boot", "dependency", "distribution", "exclude",
    "exclusive", "export", "extra-node-info", "gpu-bind", "gpu-freq", "gpus", "gpus-per-node",
    "gpus-per-socket", "gpus-per-task", "gres", "gres-flags", "hint", "hold",
    "kill-on-invalid-dep", "licenses", "mail-type", "mail-user", "mcs-label", "mem",
    "mem-bind", "mem-per-cpu", "mem-per-gpu", "mincpus", "network", "nice", "no-kill",
    "no-requeue", "nodelist", "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-socket",
    "overcommit", "oversubscribe", "partition", "power", "prefer", "priority", "profile",
    "qos", "quiet", "reboot", "requeue", "reservation", "signal", "sockets-per-node",
    "spread-job", "switches", "thread-spec", "threads-per-core", "time-min", "tmp",
    "use-min-nodes", "wckey",
})
# sbatch option (long form) -> what it does (sbatch(1), OPTIONS): passed only with an opt-in.
SBATCH_OPTIONS: dict[str, str] = {
    "--output": "writes the job's output to any path its owner can write (sbatch -o)",
    "--error": "writes the job's errors to any path its owner can write (sbatch -e)",
    "--input": "feeds the job any file its owner can read (sbatch -i)",
    "--chdir": "runs the job from another folder, where its relative paths then lead "
               "(sbatch -D)",
    "--export-file": "sets the job's environment from a file (sbatch --export-file)",
    "--get-user-env": "runs the user's login shell to build the job's environment "
                      "(sbatch --get-user-env)",
}
_FAMILY_LIST = ", ".join(f"{p}*" for p in FAMILIES)


def why_variable(name: str) -> str | None:
    """Why a job must not get variable ``name`` without an opt-in, or None when a sweep may
    set it (one of the families minus the names that point at files, or one of NAMES)."""
    name = str(name)
    if not ENV_NAME.fullmatch(name):
        return "is not a variable name (letters, digits and '_', not starting with a digit)"
    if name in NAMES:
        return None
    if name in VARIABLES:
        return VARIABLES[name]
    if name.startswith("SWEEP_"):
        return None
    family = next((p for p in sorted(FAMILIES, key=len, reverse=True) if name.startswith(p)),
                  None)
    if family is None:
        return (f"is not in the families a sweep may set ({_FAMILY_LIST}, "
                f"{', '.join(NAMES)}); any other may load code (srun's SLURM_TASK_PROLOG, "
                "Python's PYTHONPYCACHEPREFIX)")
    if _LOADS.search(name):
        return (f"names a file or folder that {FAMILIES[family].split(' (')[0]} loads from or "
                "writes to (a plugin, a library, a cache of compiled code)")
    return None


def _option_name(option: str) -> str:
    return re.split(r"[=\s]", option.strip(), maxsplit=1)[0]


def _export_names(option: str) -> list[str]:
    """The variables an sbatch ``--export=ALL,NAME=value,...`` sets to a value."""
    if _option_name(option) != "--export":
        return []
    value = re.split(r"[=\s]", option.strip(), maxsplit=1)[1:]
    if not value:
        return []
    return [item.split("=", 1)[0].strip() for item in value[0].split(",") if "=" in item]


def used(env: Iterable[tuple[str, str]], extra_sbatch: Sequence[str]) -> set[str]:
    """The names an opt-in could refer to: every variable set and every option passed."""
    names = {name for _section, name in env}
    for option in extra_sbatch:
        names.add(_option_name(option))
        names.update(_export_names(option))
    return names


def check(env: Iterable[tuple[str, str]], extra_sbatch: Sequence[str],
          allowed: Sequence[str], *, where: Mapping[str, str] | None = None) -> None:
    """Refuse each variable of ``env`` (names: ``(section, name)``) that no allow-list admits
    and each option of ``extra_sbatch`` (long form) that is not on sbatch's list a sweep may
    pass, unless ``allowed`` names it; then each name of ``allowed`` the sweep does not use.
    One line: the place, the name, why, and how to opt in."""
    env = list(env)
    allowed_set = set(allowed)
    where = where or {}
    for section, name in env:
        why = why_variable(name)
        if why and (name not in allowed_set or not ENV_NAME.fullmatch(name)):
            shown = name if ENV_NAME.fullmatch(name) else repr(name)
            raise SpecError(f"{where.get(section, '')}{section}.{shown}: {why}; refused in a "
                            f"sweep unless it opts in with allow_unsafe: [{shown}] (shown when "
                            "it renders and submits, recorded in every job script and the "
                            "manifest; docs/security.md)", "env")
    at = where.get("extra_sbatch", "")
    for option in extra_sbatch:
        name = _option_name(option)
        if name in SBATCH_OPTIONS:
            if name not in allowed_set:
                raise SpecError(f"{at}extra_sbatch {name}: {SBATCH_OPTIONS[name]}; refused "
                                f"unless the sweep opts in with allow_unsafe: [{name}] "
                                "(docs/security.md)", "extra_sbatch")
        elif name[2:] not in SBATCH_ALLOWED or not name.startswith("--"):
            raise SpecError(f"{at}extra_sbatch {name[:40]!r}: not an sbatch option a sweep may "
                            "pass; write its full long name (sbatch obeys any unambiguous "
                            "prefix, so a short one may be another option: --ch is --chdir); "
                            "the list is in docs/security.md", "extra_sbatch")
        for var in _export_names(option):
            why = why_variable(var)
            if why and var not in allowed_set:
                shown = var if ENV_NAME.fullmatch(var) else repr(var)
                raise SpecError(f"{at}extra_sbatch --export sets {shown}: {why}; refused "
                                f"unless the sweep opts in with allow_unsafe: [{shown}] "
                                "(docs/security.md)", "extra_sbatch")
    unused = [a for a in allowed if a not in used(env, extra_sbatch)]
    if unused:
        raise SpecError(f"allow_unsafe: {unused[0]!r} is not set by this sweep (an opt-in for "
                        "a name the sweep does not use is a typing mistake that would hide the "
                        "real one)", "allow_unsafe")


def check_allowed(allowed: Sequence[str] | None) -> tuple[str, ...]:
    """The ``allow_unsafe`` list as given: each entry a variable name no allow-list admits or
    an sbatch option that needs an opt-in (one that needs none is a mistake)."""
    if allowed is None:
        return ()
    if not isinstance(allowed, list) or not all(isinstance(a, str) for a in allowed):
        raise SpecError("allow_unsafe must be a list of variable names and sbatch options",
                        "allow_unsafe")
    for a in allowed:
        if a in SBATCH_OPTIONS:
            continue
        if a.startswith("-"):
            raise SpecError(f"allow_unsafe: {a[:40]!r} is not an sbatch option that needs an "
                            f"opt-in ({', '.join(SBATCH_OPTIONS)})", "allow_unsafe")
        if not ENV_NAME.fullmatch(a):
            raise SpecError(f"allow_unsafe: {a[:40]!r} is not a variable name", "allow_unsafe")
        if why_variable(a) is None:
            raise SpecError(f"allow_unsafe: {a} needs no opt-in (a sweep may set it); "
                            "leave it out", "allow_unsafe")
    return tuple(allowed)


def terminal_note(sweep: str, allowed: Sequence[str]) -> str:
    """The line flm sweep render and submit print on stderr when a sweep opts in."""
    return (f"flm: sweep {sweep} opts in to allow_unsafe: {' '.join(allowed)} (settings "
            "that load code or move the job's files; read why before submitting: "
            "docs/security.md)")


def script_note(allowed: Sequence[str]) -> str:
    """The comment line a job script carries when its sweep opted in: a reviewer reading the
    script sees it at the top."""
    return (f"# flm: this sweep opts in to allow_unsafe: {' '.join(allowed)} "
            "(settings that load code or move the job's files; docs/security.md)\n")


def with_note(script: str, allowed: Sequence[str]) -> str:
    """``script`` with :func:`script_note` after its ``#!`` line (a comment: sbatch reads the
    ``#SBATCH`` lines after it as before)."""
    if not allowed:
        return script
    first, sep, rest = script.partition("\n")
    if first.startswith("#!"):
        return first + sep + script_note(allowed) + rest
    return script_note(allowed) + script
