"""Secrets in sweep files: which values are refused, and how a variable passes by name instead.

A sweep file is copied, as written, into every job script, the sweep folder (``sweep.yaml``,
``manifest.json``) and the database (``flm_sweeps.spec_yaml``), all of which other people on a
shared file system may read. So a credential never goes into one: ``environment.pass_env``
lists variable *names* that the job takes from the shell that submits it (``sbatch`` exports
that shell's environment; the local executor passes flm's own), and the loader refuses a sweep
file that holds a secret-looking value (docs/sweeps.md "Secrets"). No message here ever repeats
the value it refuses.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from frontier_llm.errors import SpecError, UserError
from frontier_llm.specs.yamlio import LineMap
from frontier_llm.store.url import has_password

# Words of a variable name (split at "_", any case) that say it holds a credential: one that
# contains PASSWORD, PASSWD or SECRET (PGPASSWORD, AWS_SECRET_ACCESS_KEY), ends with TOKEN
# (HF_TOKEN, GITHUB_TOKEN; not TOKENIZERS_PARALLELISM), is CREDENTIAL(S) or APIKEY, or a last
# word KEY (WANDB_API_KEY, OPENAI_API_KEY, SSH_PRIVATE_KEY). The rule refuses a few harmless
# names too (a *_KEY that is no key): pass those by name as well.
_CONTAINS = ("PASSWORD", "PASSWD", "SECRET")
_WHOLE = ("CREDENTIAL", "CREDENTIALS", "APIKEY")
# A URL anywhere in a string: the scheme up to the next blank or quote.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]*")
# NAME=value in a setup line (``export HF_TOKEN=abc``); a value that starts with $ is a
# reference to another variable, not a secret written out.
_ASSIGN = re.compile(r"(?:^|[\s;&|(])(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(\S*)")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def secret_name(name: str) -> bool:
    """Whether a variable called ``name`` holds a credential, by the rule above."""
    words = [w for w in str(name).upper().split("_") if w]
    if not words:
        return False
    return (words[-1] == "KEY"
            or any(w in _WHOLE or w.endswith("TOKEN") or any(c in w for c in _CONTAINS)
                   for w in words))


def password_url(text: str) -> bool:
    """Whether ``text`` holds a URL with a password (store.url's rule), anywhere in it."""
    return any(has_password(m.group(0)) for m in _URL.finditer(text))


def _refuse(where: str, what: str, why: str) -> SpecError:
    return SpecError(
        f"{where}: {what} {why} (the value is not repeated here); a sweep file is copied into "
        "every job script, the sweep folder and the database: list the variable's name under "
        "environment.pass_env and export it in the shell that runs flm sweep submit",
        "environment")


def check_sweep_file(data: LineMap) -> None:
    """Refuse a sweep (or study) file that writes a credential out, naming file, line and key:
    an ``environment.env`` entry whose name says secret, a URL with a password in any value,
    or a setup line that sets a secret-named variable to a literal value."""
    environment = data.get("environment")
    if isinstance(environment, Mapping):
        env = environment.get("env")
        if isinstance(env, LineMap):
            for key, value in env.items():
                if secret_name(str(key)):
                    raise _refuse(env.where(key), f"environment.env.{key}",
                                  "is named like a secret (*PASSWORD*, *SECRET*, *TOKEN, "
                                  "*_KEY, ...)")
                if isinstance(value, str) and password_url(value):
                    raise _refuse(env.where(key), f"environment.env.{key}",
                                  "holds a URL with a password")
        setup = environment.get("setup")
        if isinstance(setup, list) and isinstance(environment, LineMap):
            for line in setup:
                for m in _ASSIGN.finditer(str(line)):
                    if secret_name(m.group(1)) and m.group(2).lstrip("'\"")[:1] not in ("$", ""):
                        raise _refuse(environment.where("setup"), "environment.setup",
                                      f"sets {m.group(1)}, named like a secret, to a value")
    _walk(data, data, None)


def _walk(value: Any, parent: LineMap, key: str | None) -> None:
    """A URL with a password in any string of the file (labels, command, setup...)."""
    if isinstance(value, LineMap):
        for k, v in value.items():
            _walk(v, value, str(k))
    elif isinstance(value, list):
        for v in value:
            _walk(v, parent, key)
    elif isinstance(value, str) and password_url(value):
        raise _refuse(parent.where(key), key or "a value", "holds a URL with a password")


def check_pass_env(names: Sequence[str] | None, env: Mapping | None,
                   extra_sbatch: Sequence[str] | None) -> str | None:
    """Why ``environment.pass_env`` cannot work as written (``None``: it can)."""
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return "pass_env must be a list of variable names"
    for n in names:
        if not _ENV_NAME.match(n):
            return f"pass_env name {n!r} is not a valid variable name"
        if env and n in env:
            return f"{n} is both in env and pass_env: give its value in one place"
    if len(set(names)) < len(names):
        return "pass_env names a variable twice"
    for opt in extra_sbatch or ():
        value = _export_value(opt)
        if value is not None and not export_covers(value, names):
            return (f"extra_sbatch {opt.split('=')[0]} does not export every pass_env "
                    f"variable to the job (add ALL or their names)")
    return None


def _export_value(option: str) -> str | None:
    """The value of an sbatch ``--export`` option, or None for any other option."""
    option = option.strip()
    if option.startswith("--export="):
        return option[len("--export="):]
    if option.startswith("--export "):
        return option[len("--export "):].strip()
    return None


def export_covers(value: str, names: Iterable[str]) -> bool:
    """Whether ``sbatch --export=value`` (or ``$SBATCH_EXPORT``) hands each of ``names`` on:
    ALL does, NONE and NIL do not, a list does for the names it lists."""
    items = {item.split("=", 1)[0].strip() for item in value.split(",")}
    return "ALL" in items or all(n in items for n in names)


def require_passed(names: Sequence[str], environ: Mapping[str, str], *,
                   slurm: bool = False) -> None:
    """Refuse to submit when a pass_env variable is not set in the environment the jobs get
    (one line naming the variables, never a value), or when ``$SBATCH_EXPORT`` would keep it
    from the job."""
    if not names:
        return
    missing = [n for n in names if n not in environ]
    if missing:
        raise UserError(
            f"environment.pass_env: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'}"
            f" not set in this shell; export {'it' if len(missing) == 1 else 'them'} before "
            "submitting (the jobs take the values from this shell; nothing was submitted)")
    if slurm and "SBATCH_EXPORT" in environ and not export_covers(environ["SBATCH_EXPORT"],
                                                                   names):
        raise UserError("environment.pass_env: $SBATCH_EXPORT does not export every pass_env "
                        "variable to the job (add ALL or their names; nothing was submitted)")
