"""One step of guide 10's claims recorded: its collectives and FSDP events, the backward read from them (hooks,
frees, reductions, the final callback), and the bytes each unit's unsharded flat parameter holds."""

from __future__ import annotations

import torch
from torch import nn

from checks.probes.comm import CommLog, record_comm
from checks.probes.event_log import EventLog, FsdpEvent
from checks.probes.events import record_events
from checks.workloads.gpt import units

# The events a backward's timing is read from; unshards and prefetches are guide 06's.
BACKWARD_KINDS = ("pre_backward", "post_backward", "free", "reshard", "reduce_grad", "final_callback")


def held_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes held by each unit's padded unsharded flat parameter (0 once FSDP freed its storage)."""
    return {
        name: unit._handle.flat_param._full_param_padded.untyped_storage().nbytes()
        for name, unit in units(model).items()
    }


def _describe(event: FsdpEvent) -> str:
    return event.describe() + (f" ({event.detail})" if event.kind == "post_backward" and event.detail else "")


def backward_order(events: EventLog) -> list[str]:
    """The backward's hooks, reshards, reductions and final callback, in order (``post_backward U (reshard only)``
    for the reshard-only hook)."""
    return [_describe(e) for e in events if e.kind in BACKWARD_KINDS and e.state != "FORWARD"]


def recorded_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[CommLog, EventLog]:
    """One forward and backward, with every collective and FSDP event recorded."""
    with record_comm() as comm, record_events(model) as events:
        model(x, y)[1].backward()
    return comm, events
