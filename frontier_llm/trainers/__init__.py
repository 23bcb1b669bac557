"""The trainer registry: one object per trainer flm exports to, sweeps and reads logs of
(docs/export.md "The trainer registry"; shared/DESIGN.md §8).

Each module of this package that defines ``TRAINER`` (a :class:`~frontier_llm.trainers.base.
Trainer`) is a trainer; it is found here, so adding one is that module and its tests. Everyone
else asks :func:`get` (any of a trainer's spellings) or iterates :data:`TRAINERS`.

Where the package sits (.importlinter): below ``bench/``, above ``planner/``. ``flm bench
--engine deepspeed`` builds its ds_config with the DeepSpeed trainer's builder
(``trainers/deepspeed_config.py``), so the package must sit below bench; ``export/``, ``logs/``,
``jobs/`` and the command line sit above and import it. A trainer's log reader is its own
(``Trainer.log_reader``, from its ``*_log.py`` module); ``logs/traces.py`` turns what it reads
into traces with bench's summaries.
"""

from __future__ import annotations

import importlib
import pkgutil

from frontier_llm.errors import UserError
from frontier_llm.trainers.base import EnvVar, Trainer
from frontier_llm.trainers.log_reader import LogReader


def _discover() -> dict[str, Trainer]:
    found = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        trainer = getattr(module, "TRAINER", None)
        if isinstance(trainer, Trainer):
            found.append(trainer)
    return {t.name: t for t in sorted(found, key=lambda t: (t.order, t.name))}


TRAINERS: dict[str, Trainer] = _discover()
NAMES: tuple[str, ...] = tuple(TRAINERS)
# The log formats, by the name ``flm collect --from-logs --trainer`` and the traces' ``trainer``
# label use (Megatron-LM and Megatron-DeepSpeed print the same lines: one reader).
LOG_READERS: dict[str, LogReader] = {t.log_reader.name: t.log_reader for t in TRAINERS.values()}


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-")


_SPELLINGS = {_key(s): t for t in TRAINERS.values() for s in (t.name, *t.aliases)}


class UnknownTrainer(UserError):
    """A name no trainer answers to (one line naming the choices)."""


def get(name: str) -> Trainer:
    """The trainer any of whose spellings is ``name`` (case, ``_`` / ``-`` ignored)."""
    try:
        return _SPELLINGS[_key(str(name))]
    except KeyError:
        raise UnknownTrainer(f"unknown trainer {name!r} (one of {', '.join(NAMES)})") from None


def spellings() -> tuple[str, ...]:
    """Every name and alias, for a command line's choices."""
    return tuple(dict.fromkeys(s for t in TRAINERS.values() for s in (t.name, *t.aliases)))


def log_reader(name: str) -> LogReader:
    """The log reader of a trainer (any spelling) or of a log format (``megatron``)."""
    return LOG_READERS.get(name) or get(name).log_reader


__all__ = ["LOG_READERS", "NAMES", "TRAINERS", "EnvVar", "LogReader", "Trainer",
           "UnknownTrainer", "get", "log_reader", "spellings"]
