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
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from frontier_llm.errors import SpecError, UserError
from frontier_llm.specs.yamlio import LineMap
from frontier_llm.store.url import has_password, password_pairs

# Words of a variable name (split at "_", any case) that say it holds a credential: one that
# contains PASSWORD, PASSWD or SECRET (PGPASSWORD, AWS_SECRET_ACCESS_KEY), ends with TOKEN
# (HF_TOKEN, GITHUB_TOKEN; not TOKENIZERS_PARALLELISM), is CREDENTIAL(S) or APIKEY, or a last
# word KEY (WANDB_API_KEY, OPENAI_API_KEY, SSH_PRIVATE_KEY). The rule refuses a few harmless
# names too (a *_KEY that is no key): pass those by name as well.
# Also PASSPHRASE (SSH_KEY_PASSPHRASE), and a last word PASS (DB_PASS, MYSQL_PASS) or PAT (a
# personal access token: GH_PAT, GITLAB_PAT).
_CONTAINS = ("PASSWORD", "PASSWD", "PASSPHRASE", "SECRET")
_WHOLE = ("CREDENTIAL", "CREDENTIALS", "APIKEY")
_LAST = ("KEY", "PASS", "PAT")
# A URL anywhere in a string: the scheme up to the next blank or quote.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]*")
# A URL whose password holds a blank or a quote (postgresql://me:'a b'@db/flm), which the
# blank-ended match above cuts short: a user, ":", then anything but "@", "/" or a line end,
# then "@" and a host. ("/" is left out so that https://host:8080/x me@example.org is no
# password.)
_SPACED = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s@:'\"]+:[^@/\n]*[\s'\"][^@/\n]*@\w")
# NAME=value in a setup line (``export HF_TOKEN=abc``), also quoted whole (``export
# "HF_TOKEN=abc"``), appended to (``+=``) or set by bash's declare/typeset/local/readonly
# (bash(1), SHELL BUILTIN COMMANDS); a value that starts with $ is a reference to another
# variable, not a secret written out (but ``$'...'`` is bash's ANSI-C quoting: a literal).
_ASSIGN = re.compile(r"(?:^|[\s;&|(])(?:(?:export|declare|typeset|local|readonly)"
                     r"(?:\s+-\w+)*\s+)?[\"']?([A-Za-z_][A-Za-z0-9_]*)\+?=(\S*)")
# ``read NAME <<< value``: bash's read assigns a here-string's text (bash(1), read, Here Strings).
_READ = re.compile(r"(?:^|[\s;&|(])read\s+(?:-\w+\s+)*([A-Za-z_][A-Za-z0-9_]*)[^<]*<<<\s*(\S+)")
_ENV_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")  # whole string: not "NAME\n"
# ``printf -v NAME FORMAT ARGS``: bash's builtin assigns the formatted text to NAME (bash(1),
# SHELL BUILTIN COMMANDS, printf), another way to write a value out.
_PRINTF_V = re.compile(r"(?:^|[\s;&|(])printf\s+-v\s*([A-Za-z_][A-Za-z0-9_]*)(.*)$")
# A printf conversion (%s, %-10d, %%): what a format holds besides text of its own.
_CONVERSION = re.compile(r"%[-+ #0-9.]*[a-zA-Z%]")


def _literal(value: str) -> bool:
    """Whether the shell word ``value`` (as the setup line has it) is a value written out: a
    word in single quotes is one whatever it holds (``'$x'`` is the two characters $ and x;
    bash(1), QUOTING); ``$X``, ``"$X"``, ``"${X}"`` and ``$(...)`` refer to something else."""
    if not value or value in ("''", '""'):
        return False
    if value.startswith(("'", "$'", '$"')):
        return True
    return not value.lstrip('"').startswith("$")


def _printf_literal(rest: str) -> bool:
    """Whether ``printf -v NAME`` with these arguments writes text of its own into NAME: a
    format with text besides its conversions, or an argument that is not a reference."""
    try:
        words = shlex.split(rest, comments=True)
        raw = shlex.split(rest, comments=True, posix=False)  # the words with their quotes
    except ValueError:
        return True  # unbalanced quotes: cannot tell, so it counts as a value
    if not words:
        return False
    if _CONVERSION.sub("", words[0]).strip("\\n"):
        return True
    return any(_literal(w) for w in raw[1:])


def secret_name(name: str) -> bool:
    """Whether a variable called ``name`` holds a credential, by the rule above."""
    words = [w for w in str(name).upper().split("_") if w]
    if not words:
        return False
    return (words[-1] in _LAST
            or any(w in _WHOLE or w.endswith("TOKEN") or any(c in w for c in _CONTAINS)
                   for w in words))


def password_url(text: str) -> bool:
    """Whether ``text`` holds a URL with a password (store.url's rule: in the credentials or as
    a query-string ``password=``), anywhere in it, also one whose password holds blanks or
    quotes."""
    return (any(has_password(m.group(0)) for m in _URL.finditer(text))
            or _SPACED.search(text) is not None)


def password_pair(text: str) -> bool:
    """Whether ``text`` holds a ``password=VALUE`` pair (a libpq keyword string such as
    ``host=db password=x``) with a literal value; ``password=$PGPASSWORD`` refers to a
    variable and is no secret written out."""
    return any(v and not v.startswith("$") for v in password_pairs(text))


def _refuse(where: str, what: str, why: str) -> SpecError:
    return SpecError(
        f"{where}: {what} {why} (the value is not repeated here); a sweep file is copied into "
        "every job script, the sweep folder and the database: list the variable's name under "
        "environment.pass_env and export it in the shell that runs flm sweep submit",
        "environment")


def check_sweep_file(data: LineMap) -> None:
    """Refuse a sweep (or study) file that writes a credential out, naming file, line and key:
    an ``environment.env`` or ``site.env*`` entry whose name says secret, a URL with a password
    (or a ``password=`` pair) in any value, or an ``environment.setup`` or ``site.setup`` line
    that sets a secret-named variable to a literal value. The ``site:`` section is copied into
    the job scripts as the ``environment:`` one is."""
    sections = [("environment", data.get("environment"), ("env",))]
    site = data.get("site")
    if isinstance(site, LineMap):
        sections.append(("site", site, tuple(k for k in site if str(k).startswith("env"))))
    for prefix, section, env_keys in sections:
        if not isinstance(section, LineMap):
            continue
        for env_key in env_keys:
            env = section.get(env_key)
            if not isinstance(env, LineMap):
                continue
            for key, value in env.items():
                what = f"{prefix}.{env_key}.{key}"
                if secret_name(str(key)):
                    raise _refuse(env.where(key), what,
                                  "is named like a secret (*PASSWORD*, *SECRET*, *TOKEN, "
                                  "*_KEY, *_PASS, *_PAT, ...)")
                if isinstance(value, str) and password_url(value):
                    raise _refuse(env.where(key), what, "holds a URL with a password")
        setup = section.get("setup")
        if isinstance(setup, list):
            for line in setup:
                _check_setup_line(str(line), section.where("setup"), f"{prefix}.setup")
    _walk(data, data, None)


def _check_setup_line(line: str, where: str, what: str) -> None:
    """A setup line that sets a secret-named variable to a value written out: ``NAME=v``,
    ``export NAME='v'`` (quoted ``$`` too) or ``printf -v NAME 'v'``."""
    for m in _ASSIGN.finditer(line):
        if secret_name(m.group(1)) and _literal(m.group(2)):
            raise _refuse(where, what, f"sets {m.group(1)}, named like a secret, to a value")
    for m in _READ.finditer(line):
        if secret_name(m.group(1)) and _literal(m.group(2)):
            raise _refuse(where, what, f"sets {m.group(1)}, named like a secret, to a value "
                          "(read <<<)")
    for m in _PRINTF_V.finditer(line):
        if secret_name(m.group(1)) and _printf_literal(m.group(2)):
            raise _refuse(where, what,
                          f"sets {m.group(1)}, named like a secret, to a value (printf -v)")


def _walk(value: Any, parent: LineMap, key: str | None) -> None:
    """A URL with a password, or a ``password=`` pair, in any string of the file (labels,
    command, setup...). Iterative, and after the YAML loader's node budget: a file of
    aliases cannot make it run long (specs/yamlio.py)."""
    stack: list[tuple[Any, LineMap, str | None]] = [(value, parent, key)]
    seen: set[int] = set()
    while stack:
        value, parent, key = stack.pop()
        if isinstance(value, LineMap | list):
            # An alias is the same object each time: walk it once.
            if id(value) in seen:
                continue
            seen.add(id(value))
        if isinstance(value, LineMap):
            stack.extend(reversed([(v, value, str(k)) for k, v in value.items()]))
        elif isinstance(value, list):
            stack.extend(reversed([(v, parent, key) for v in value]))
        elif isinstance(value, str):
            if password_url(value):
                raise _refuse(parent.where(key), key or "a value", "holds a URL with a password")
            if password_pair(value):
                raise _refuse(parent.where(key), key or "a value", "holds a password= pair")


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
