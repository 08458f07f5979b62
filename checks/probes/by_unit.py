"""Which FSDP1 unit each recorded collective served: the comm log and the event log joined by the clock they
share (guides 08 and 10)."""

from __future__ import annotations

from typing import Any

from checks.probes.comm import CommLog
from checks.probes.event_log import EventLog

_ISSUER_KINDS = {"reduce_scatter": ("reduce_grad",), "all_gather": ("unshard", "prefetch")}


def collectives_by_unit(comm: CommLog, events: EventLog, op: str, in_backward: bool | None = None) -> list[str]:
    """Each recorded ``op`` (``reduce_scatter`` or ``all_gather``) as ``"<unit> <elements>"``. The unit is the one
    FSDP was working on when the collective was issued, by the clock the two recorders share: for a
    reduce-scatter the last ``reduce_grad`` event before it, for an all-gather the last unshard (its own unit) or
    prefetch (its target) before it; ``?`` when no such event came first. Sizes alone cannot tell the three
    blocks apart (16,020 elements each at N=2): this does. ``in_backward`` keeps only the collectives issued in
    (True) or outside (False) backward."""
    issuers = [e for e in events if e.kind in _ISSUER_KINDS[op]]
    out = []
    for c in comm.select(op):
        if in_backward is not None and c.in_backward != in_backward:
            continue
        before = [e for e in issuers if e.seq < c.seq]
        out.append(f"{_unit_served(before[-1]) if before else '?'} {c.numel}")
    return out


def _unit_served(event: Any) -> str:
    """The unit an issuing event works for: a prefetch's target, otherwise the event's own unit."""
    return (event.target or "?") if event.kind == "prefetch" else event.unit
