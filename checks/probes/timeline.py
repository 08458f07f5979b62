"""One FSDP1 training step written as the guides write it: ``<phase> <unit> <action>`` lines.

The guides state expected timelines in this form (in ``expect`` blocks); checks render what `record_events`
observed the same way and compare line by line. Units are named as everywhere (`checks.naming`: ``root``, ``blocks.0``).
"""

from __future__ import annotations

from collections.abc import Iterable

from checks.probes.event_log import EventLog, FsdpEvent


def action(event: FsdpEvent) -> str:
    """What the event did, in the guide's words."""
    match event.kind:
        case "root_pre_forward":
            return "root pre-forward"
        case "unshard":
            return f"unshard ({event.detail})"
        case "prefetch":
            return f"prefetch {event.target} ({event.detail})"
        case "free":
            return "reshard, free"
        case "reshard":
            return "reshard, keep"
        case "pre_backward":
            return "pre-backward hook"
        case "post_backward":
            return "post-backward hook"
        case "reduce_grad":
            return event.detail
        case "final_callback":
            return "final callback"
    return event.kind


def lines(events: EventLog, iteration: int = 1) -> list[str]:
    """The iteration's events as ``phase unit action``; phase turns to backward at the first pre-backward hook."""
    phase = "forward"
    out = []
    for event in events.select(iteration=iteration):
        if event.kind == "pre_backward":
            phase = "backward"
        out.append(f"{phase} {event.unit} {action(event)}")
    return out


def normalized(items: Iterable[str]) -> list[str]:
    """Collapse the column padding a guide uses to align its timeline."""
    return [" ".join(item.split()) for item in items]
