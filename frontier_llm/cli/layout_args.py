"""The layout options shared by every command that takes one layout (flm predict, flm bench).

Every flag is derived from a :class:`~frontier_llm.specs.layout.Layout` field: an int field is
``--name N``, a vocabulary field ``--name WORD`` with the vocabulary as ``choices``, a boolean
``--name`` (default off) or ``--no-name`` (default on), the sharding ``--sharding TEXT`` (the text
of ``Sharding.describe``) with ``--zero N`` as a shorthand. The same flags are what
:func:`~frontier_llm.specs.layout.layout_argv` writes, so the codec round-trips.
"""

from __future__ import annotations

import argparse

from frontier_llm.cli.numbers import MAX_COUNT, count
from frontier_llm.specs.layout import (
    Layout,
    Sharding,
    Vocabulary,
    complete_layout,
    given_options,
    layout_fields,
    layout_types,
)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_layout_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """Add the layout flags; every default is None ("not given") and filled by
    :func:`layout_from_args` from the Layout's defaults."""
    g = parser.add_argument_group("layout")
    defaults = Layout()
    for f in layout_fields():
        kind, help_text = layout_types()[f.name], f.metadata.get("help", "")
        default = getattr(defaults, f.name)
        is_required = required and f.name == "tp"
        if (f.metadata.get("default_text", True) and kind is not bool and kind is not Sharding
                and not is_required):
            help_text += f" (default {default})"
        if kind is Sharding:
            shard = g.add_mutually_exclusive_group()
            shard.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=None,
                               help="ZeRO stage preset for sharding model states over DP "
                                    "(default 0)")
            shard.add_argument(flag(f.name), default=None, metavar="p=..,g=..,o=..",
                               help=help_text)
        elif kind is bool:
            if default:
                g.add_argument("--no-" + f.name.replace("_", "-"), dest=f.name,
                               action="store_false", default=None, help=help_text)
            else:
                g.add_argument(flag(f.name), action="store_true", default=None, help=help_text)
        elif issubclass(kind, Vocabulary):
            g.add_argument(flag(f.name), choices=kind.words(), default=None, help=help_text)
        else:
            g.add_argument(flag(f.name), type=count(1, MAX_COUNT, flag(f.name)), default=None,
                           required=is_required,
                           help=help_text)


def parse_sharding(text: str) -> Sharding:
    """``--sharding`` text (kept for callers; it is :meth:`Sharding.parse`)."""
    return Sharding.parse(text)


def layout_from_args(args: argparse.Namespace, default_dtype: str = "bf16") -> Layout:
    """A validated Layout from the layout options (SpecError names the broken rule)."""
    values = given_options(args)
    values.setdefault("dtype", default_dtype)
    return Layout.from_dict(complete_layout(values))
