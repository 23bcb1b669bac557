"""The layout options shared by every command that takes one layout (flm predict, flm bench).

Every flag is derived from a :class:`~frontier_llm.specs.layout.Layout` field: an int field is
``--name N``, a vocabulary field ``--name WORD`` with the vocabulary as ``choices``, a boolean
``--name`` (default off) or ``--no-name`` (default on), the sharding ``--sharding TEXT`` (the text
of ``Sharding.describe``) with ``--zero N`` as a shorthand. The same flags are what
:func:`~frontier_llm.specs.layout.layout_argv` writes, so the codec round-trips.
"""

from __future__ import annotations

import argparse

from frontier_llm.cli.numbers import MAX_COUNT, count, count_list
from frontier_llm.specs.layout import (
    Layout,
    Sharding,
    Vocabulary,
    complete_layout,
    given_options,
    int_minimum,
    layout_fields,
    layout_types,
    zero_preset,
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
            g.add_argument(flag(f.name), type=count(int_minimum(f.name), MAX_COUNT, flag(f.name)),
                           default=None,
                           required=is_required,
                           help=help_text)


_BOOL_WORDS = {"on": True, "off": False, "true": True, "false": False}


def _word_list(kind: type, name: str):
    """A comma-separated list of one knob's values (words for a vocabulary, on/off for a
    boolean), checked as argparse reads it."""
    def parse(text: str) -> tuple:
        words = [w.strip() for w in text.split(",") if w.strip()]
        if kind is bool:
            bad = [w for w in words if w.lower() not in _BOOL_WORDS]
            valid = "on, off"
        else:
            bad = [w for w in words if w not in kind.words()]
            valid = ", ".join(kind.words())
        if bad or not words:
            raise argparse.ArgumentTypeError(f"{flag(name)} takes comma-separated values of "
                                             f"{valid} (got {text!r})")
        return tuple(_BOOL_WORDS[w.lower()] for w in words) if kind is bool else tuple(words)

    parse.__name__ = f"{name} list"
    return parse


def add_space_args(group: argparse._ArgumentGroup) -> None:
    """One restrict flag per knob of the searchable space (specs.space), derived from the
    fields: a number ``--name 4,8``, a vocabulary ``--name WORD[,WORD]``, a boolean
    ``--name on|off|on,off``, the sharding ``--sharding TEXT [TEXT ...]`` or ``--zero N [N ...]``.
    Not given: the knob is open (its default list)."""
    from frontier_llm.specs.space import open_values, space_knobs

    for name, kind in space_knobs().items():
        opened = open_values(name)
        default = ("the planner's list" if opened is None else
                   ", ".join(("on" if v else "off") if kind is bool else str(v) for v in opened))
        text = f"search only these {name.replace('_', ' ')} values (default: {default})"
        if kind is Sharding:
            shard = group.add_mutually_exclusive_group()
            shard.add_argument("--zero", type=int, nargs="+", choices=(0, 1, 2, 3),
                               help="only these ZeRO presets (default: ZeRO-0..3 and the AMSP "
                                    "placements partial over the GPUs of a node)")
            shard.add_argument(flag(name), nargs="+", type=Sharding.parse, metavar="TEXT",
                               help=f"search only these shardings, each a ZeRO preset "
                                    f"zero0..zero3 or p=..,g=..,o=.. with placements replicate, "
                                    f"full or partial:K (default: {default})")
        elif kind is int:
            group.add_argument(flag(name), type=count_list(1, MAX_COUNT), metavar="N[,N]",
                               help=text)
        else:
            words = "on,off" if kind is bool else ",".join(kind.words())
            group.add_argument(flag(name), type=_word_list(kind, name), action="extend",
                               nargs="+", metavar="{" + words + "}", help=text)
    # The old spelling of --flash-attention off, kept working.
    group.add_argument("--no-flash-attention", dest="flash_attention", action="store_const",
                       const=[False], help=argparse.SUPPRESS)


def space_from_args(args: argparse.Namespace) -> dict:
    """The value lists the restrict flags gave, as SearchSpace keywords (None: open)."""
    from frontier_llm.specs.space import space_knobs

    out = {}
    for name in space_knobs():
        given = getattr(args, name, None)
        if given is None:
            out[name] = None
            continue
        # Several flags or words (--recompute none full, --recompute none,full) are one list.
        flat = [v for item in given for v in (item if isinstance(item, tuple) else (item,))]
        out[name] = tuple(dict.fromkeys(flat))
    if getattr(args, "zero", None):
        out["sharding"] = tuple(zero_preset(z) for z in args.zero)
    return out


def parse_sharding(text: str) -> Sharding:
    """``--sharding`` text (kept for callers; it is :meth:`Sharding.parse`)."""
    return Sharding.parse(text)


def layout_from_args(args: argparse.Namespace, default_dtype: str = "bf16") -> Layout:
    """A validated Layout from the layout options (SpecError names the broken rule)."""
    values = given_options(args)
    values.setdefault("dtype", default_dtype)
    return Layout.from_dict(complete_layout(values))
