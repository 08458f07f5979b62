"""FSDP1's all-gather rate limiter (``limit_all_gathers=True``), as guide 03 reads ``_FreeEventQueue``.

A reshard that frees a unit's unsharded parameter queues one free event. An unshard (for the unit itself or as a
prefetch) that finds ``limit`` or more events queued first waits for the oldest, which leaves the queue; each
unshard retires at most one event.
"""

from __future__ import annotations

from collections.abc import Sequence

KINDS = ("unshard", "prefetch", "free")


def queue_calls(events: Sequence[str], pending: int, limit: int) -> list[str]:
    """What the queue sees over ``events`` (kinds from `KINDS`), starting with ``pending`` events queued:
    ``queue <n>`` after an enqueue, ``unshard <n> wait|go`` for an unshard that found n queued."""
    out = []
    for kind in events:
        if kind not in KINDS:
            raise ValueError(f"unknown event {kind!r}; one of {', '.join(KINDS)}")
        if kind == "free":
            pending += 1
            out.append(f"queue {pending}")
        else:
            waits = pending >= limit
            out.append(f"unshard {pending} {'wait' if waits else 'go'}")
            pending -= waits
    return out
