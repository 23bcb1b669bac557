"""A per-rank memory limit (``--memory-limit 512M``) and telling out-of-memory from other errors.

The limit is ``RLIMIT_DATA``: since Linux 4.7 it bounds the private writable memory of the
process (heap and anonymous mappings, which is where tensors live), so an allocation beyond it
fails in the allocator like a real out-of-memory and torch raises. ``RLIMIT_AS`` would count the
hundreds of MB of address space torch reserves without touching and trip long before memory is
short. The limit covers the whole process, torch and Python included (about 270 MB on CPU).
"""

from __future__ import annotations

import re
import resource

from frontier_llm.errors import UserError

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}

# Messages of allocation failures from the CPU allocator, CUDA/HIP, and glibc's bad_alloc.
_OOM_PATTERNS = ("out of memory", "can't allocate memory", "cannot allocate memory",
                 "std::bad_alloc", "failed to allocate", "alloc_cpu")
# c10's enforce message when the allocator fails ("[enforce fail at alloc_cpu.cpp:...] ...
# can't allocate memory"). Under a tight memory limit the message itself cannot be built whole
# and arrives cut short (seen: "[enforce fail a"); a cut one, ending before its location's "]",
# is such a failure too.
_ENFORCE = "[enforce fail"


def parse_bytes(text: str) -> int:
    """``512M`` / ``2G`` / ``1.5G`` / ``1000000`` -> bytes (binary units)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)i?B?\s*", str(text), re.IGNORECASE)
    if not m:
        raise UserError(f"--memory-limit must be a size like 512M or 2G (got {text!r})")
    number = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if not number < 2**63:  # also inf, from a number too long for a float
        raise UserError(f"--memory-limit is too large (got {text!r})")
    value = int(number)
    if value <= 0:
        raise UserError(f"--memory-limit must be positive (got {text!r})")
    return value


def apply_limit(limit_bytes: int) -> None:
    """Cap this process's data segment; later allocations beyond it fail."""
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit_bytes = min(limit_bytes, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit_bytes, hard))


def is_oom(exc: BaseException) -> bool:
    """True for allocation failures: MemoryError, torch.OutOfMemoryError, allocator errors."""
    if isinstance(exc, MemoryError):
        return True
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):  # pragma: no cover
        pass
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc).lower()
    if any(p in text for p in _OOM_PATTERNS):
        return True
    return _ENFORCE.startswith(text) or (text.startswith(_ENFORCE) and "]" not in text)
