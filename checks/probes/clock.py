"""One sequence counter shared by every recorder in a rank, so collectives and FSDP events interleave correctly.

A record's ``seq`` orders it against records of the other recorders (which collective ran inside which hook);
it is not comparable across ranks and not a time.
"""

from __future__ import annotations

import itertools

_COUNTER = itertools.count(1)


def tick() -> int:
    """The next sequence number (``next`` on an ``itertools.count`` is atomic under the GIL)."""
    return next(_COUNTER)
