"""What a value in an ``#SBATCH`` line may hold, per option.

Shell quoting is not enough in a directive: sbatch reads ``#SBATCH`` lines with a parser of
its own, which honours ``\\'`` inside single quotes, so a value such as
``x\\'" --export=ALL,LD_PRELOAD=./evil.so #`` (from the sweep, ``--account`` or
``$FLM_ACCOUNT``) would end its word early and add sbatch options of its own, past the
``pass_env`` export check. So each field has a conservative character set, with none of the
characters sbatch splits or quotes at (blanks, quotes, backslash), and anything else is refused
in one line that names the field. The value itself is not repeated: it may be hostile, and a
careless one may hold something private.
"""

from __future__ import annotations

import re

from frontier_llm.errors import SpecError

_NAME = "letters, digits, '.', '_', '-'"
# field -> (pattern of the whole value, what it allows in words)
FIELDS: dict[str, tuple[re.Pattern[str], str]] = {
    "account": (re.compile(r"[A-Za-z0-9_.-]+"), _NAME),
    # Several partitions or QOS may be listed, comma-separated.
    "partition": (re.compile(r"[A-Za-z0-9_.,-]+"), _NAME + ", ','"),
    "qos": (re.compile(r"[A-Za-z0-9_.,-]+"), _NAME + ", ','"),
    # Node features with sbatch's operators: intel&gpu, [rack1*2&rack2*4], (a|b), !x.
    "constraint": (re.compile(r"[A-Za-z0-9_.,&|\[\]()*!:-]+"), _NAME + " and , & | [ ] ( ) * ! :"),
    "mem": (re.compile(r"[0-9]+[KMGTkmgt]?"), "a number with an optional unit K, M, G or T"),
    "time": (
        re.compile(r"(?:[0-9]+-)?[0-9]+(?::[0-9]+){0,2}|UNLIMITED|INFINITE"),
        "a SLURM time (MM, HH:MM:SS, D-HH:MM:SS) or UNLIMITED",
    ),
    "job_name": (re.compile(r"[A-Za-z0-9_.-]+"), _NAME),
    # An option, then optionally =value: --constraint=nvme, --gres=gpu:4, --signal=B:USR1@60,
    # --export=ALL,X=1, --exclude=node[1-3], --mail-user=me@example.org.
    "extra_sbatch": (
        re.compile(r"--[A-Za-z][A-Za-z0-9-]*(?:=[A-Za-z0-9_.,:/=@%+&|\[\]()*!~^-]*)?"),
        "one '--name' or '--name=value' option, the value of letters, digits and "
        "_ . , : / = @ % + & | [ ] ( ) * ! ~ ^ -",
    ),
}
# Every character some field allows.
_ANY = re.compile(r"[A-Za-z0-9_.,:/=@%+&|\[\]()*!~^-]")
# A path (the log pattern under the sweep folder): anything but the characters that change
# how sbatch reads a quoted word.
_PATH_REFUSED = set("'\"\\\n\r\0")


def check(field: str, value: str | None) -> None:
    """Refuse ``value`` for the ``#SBATCH`` option ``field`` (a key of :data:`FIELDS`) unless it
    is wholly of the field's characters; ``None`` (the cluster's default) passes."""
    if value is None:
        return
    value = str(value)
    if "\n" in value or "\r" in value:
        raise SpecError(f"{field} must be one line (it holds a newline)", field)
    pattern, allowed = FIELDS[field]
    if pattern.fullmatch(value):
        return
    # Name the first character that is outside every field's set, else the form is wrong.
    where = next((i for i, c in enumerate(value) if not _ANY.fullmatch(c)), None)
    what = (
        f"character {value[where]!r} at position {where + 1}" if where is not None else "its form"
    )
    raise SpecError(
        f"{field}: {what} is not allowed in an #SBATCH value (allowed: {allowed}); "
        "sbatch reads directives with its own quoting rules, so such a value could "
        "add options of its own (the value is not repeated here)",
        field,
    )


def check_path(field: str, value: str) -> None:
    """Refuse a path in an ``#SBATCH`` line that holds a quote, a backslash or a newline."""
    bad = sorted(_PATH_REFUSED & set(value))
    if bad:
        if "\n" in bad or "\r" in bad:
            raise SpecError(f"{field} must be one line (it holds a newline)", field)
        raise SpecError(
            f"{field}: the path holds {' '.join(repr(c) for c in bad)}, which "
            "sbatch's directive parser would read as quoting; use a folder "
            "without quotes or backslashes",
            field,
        )
