"""Root cause or echo: which rank errors only report that a peer died.

When one rank of a job crashes or hangs, every other rank fails too, in its next collective:
gloo's ``Connection closed by peer`` / ``Read error ... Connection reset by peer`` / ``Timed out
waiting ... for recv``, NCCL's ``remote process exited or there was a network error`` and its
watchdog's ``collective operation timeout``. Those are *collateral*: true, but about a peer.
The bench marks them in its rank status files (bench/run.py) and the job classifier
(jobs/classify.py) reads them from logs; both then name the error that is not collateral.
"""

from __future__ import annotations

import re

# Each phrase is what the communication library says on a healthy rank whose peer went away
# (texts in tests/test_jobs_classify.py, with where each was seen). Not the bare word "peer":
# CUDA's "peer access is not supported between these two devices" is a root cause.
_COLLATERAL = re.compile(
    r"connection (closed|reset)|closed by (remote )?peer|reset by peer|\bread error\b"
    r"|\bwrite error\b|broken pipe|connection refused"
    r"|remote process exit|ncclremoteerror|communicator was aborted"
    r"|timed out|\btimeout\b|timing out",
    re.IGNORECASE)


def is_collateral(text: str) -> bool:
    """Whether an error text is a communication failure seen because a peer died or hung."""
    return bool(_COLLATERAL.search(text))

