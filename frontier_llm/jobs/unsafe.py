"""Settings of a sweep file that load code or move a job's files, refused unless the sweep
opts in by name (``allow_unsafe:``), an opt-in the rendered scripts and the manifest record.

A sweep's values are shell-quoted, so they arrive as data (docs/sweeps.md "Security"); but some
variables are read by the programs the job starts as *instructions*: a library to load into
every process, a file of shell to run first, where to look for programs. And some sbatch
options write the job's output to any path its owner may write, or run it from another folder.
A sweep someone else wrote could use them to run code as whoever submits it, in a place no
reviewer reads. Each name below is refused with its source; nothing here repeats a value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from frontier_llm.errors import SpecError

# variable -> the program that reads it as code, and where that is documented.
VARIABLES: dict[str, str] = {
    "LD_PRELOAD": "ld.so loads these libraries into every program (ld.so(8))",
    "LD_AUDIT": "ld.so loads these auditing libraries into every program (ld.so(8))",
    "LD_LIBRARY_PATH": "ld.so looks here first for every shared library (ld.so(8))",
    "BASH_ENV": "bash runs this file before a non-interactive script (bash(1), INVOCATION)",
    "ENV": "sh and bash in POSIX mode run this file at start-up (bash(1), INVOCATION)",
    "SHELLOPTS": "bash reads its start-up options from it (bash(1), Shell Variables)",
    "BASHOPTS": "bash reads its start-up options from it (bash(1), Shell Variables)",
    "PROMPT_COMMAND": "bash runs it before each prompt (bash(1), Shell Variables)",
    "IFS": "changes how the job script's shell splits words (bash(1), Word Splitting)",
    "PATH": "decides which program each command name runs (bash(1), COMMAND EXECUTION)",
    "PYTHONSTARTUP": "Python runs this file at start-up (python(1), ENVIRONMENT)",
    "PYTHONPATH": "Python imports modules from here first (python(1), ENVIRONMENT)",
    "PYTHONHOME": "Python's standard library is taken from here (python(1), ENVIRONMENT)",
    "PYTHONUSERBASE": "Python imports site packages from here (python(1), ENVIRONMENT)",
    "PYTHONINSPECT": "Python enters an interactive prompt after the script (python(1))",
    "PERL5OPT": "perl adds these command-line options, -M loads a module (perlrun(1))",
    "PERL5LIB": "perl loads modules from here first (perlrun(1))",
    "NODE_OPTIONS": "node adds these options, --require loads a module (node(1))",
    "GCONV_PATH": "glibc loads character-set converters from here (iconv(3))",
}
# Prefixes: bash imports a variable BASH_FUNC_name%% as a function (bash(1), after the 2014
# "Shellshock" fix), which replaces a command the script calls.
PREFIXES: dict[str, str] = {
    "BASH_FUNC_": "bash imports it as a shell function (bash(1), FUNCTIONS)",
}
# sbatch option (long form) -> what it does (sbatch(1), OPTIONS).
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


def why_variable(name: str) -> str | None:
    """Why a job must not get variable ``name`` without an opt-in, or None."""
    name = str(name)
    if name in VARIABLES:
        return VARIABLES[name]
    return next((why for p, why in PREFIXES.items() if name.startswith(p)), None)


def _option_name(option: str) -> str:
    return option.split("=", 1)[0].strip()


def _export_names(option: str) -> list[str]:
    """The variables an sbatch ``--export=ALL,NAME=value,...`` sets to a value."""
    if _option_name(option) != "--export" or "=" not in option:
        return []
    value = option.split("=", 1)[1]
    return [item.split("=", 1)[0].strip() for item in value.split(",") if "=" in item]


def check(env: Iterable[tuple[str, str]], extra_sbatch: Sequence[str],
          allowed: Sequence[str], *, where: Mapping[str, str] | None = None) -> None:
    """Refuse each variable of ``env`` (names: ``(section, name)``) and each option of
    ``extra_sbatch`` (long form) that loads code or moves the job's files, unless ``allowed``
    names it. One line: the place, the name, why, and how to opt in."""
    allowed_set = set(allowed)
    where = where or {}
    for section, name in env:
        why = why_variable(name)
        if why and name not in allowed_set:
            raise SpecError(f"{where.get(section, '')}{section}.{name}: {why}; refused in a "
                            f"sweep unless it opts in with allow_unsafe: [{name}] (recorded in "
                            "every job script and the manifest; docs/security.md)", "env")
    for option in extra_sbatch:
        name = _option_name(option)
        if name in SBATCH_OPTIONS and name not in allowed_set:
            raise SpecError(f"{where.get('extra_sbatch', '')}extra_sbatch {name}: "
                            f"{SBATCH_OPTIONS[name]}; refused unless the sweep opts in with "
                            f"allow_unsafe: [{name}] (docs/security.md)", "extra_sbatch")
        for var in _export_names(option):
            why = why_variable(var)
            if why and var not in allowed_set:
                raise SpecError(f"{where.get('extra_sbatch', '')}extra_sbatch --export sets "
                                f"{var}: {why}; refused unless the sweep opts in with "
                                f"allow_unsafe: [{var}] (docs/security.md)", "extra_sbatch")


def check_allowed(allowed: Sequence[str] | None) -> tuple[str, ...]:
    """The ``allow_unsafe`` list as given, each entry a name this module knows: an opt-in for
    a name that is never refused is a typing mistake that would hide the real one."""
    if allowed is None:
        return ()
    if not isinstance(allowed, list) or not all(isinstance(a, str) for a in allowed):
        raise SpecError("allow_unsafe must be a list of variable names and sbatch options",
                        "allow_unsafe")
    for a in allowed:
        if why_variable(a) is None and a not in SBATCH_OPTIONS:
            raise SpecError(f"allow_unsafe: {a!r} is not a variable or sbatch option flm "
                            f"refuses (variables: {', '.join(VARIABLES)}, BASH_FUNC_*; "
                            f"options: {', '.join(SBATCH_OPTIONS)})", "allow_unsafe")
    return tuple(allowed)


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
