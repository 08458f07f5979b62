"""Record the moment each parameter's gradient is ready, and each forward, on the clock the collective recorder
shares: ``with record_grad_ready(model) as ready: ...``.

DDP has no Python hook of its own to observe: its reducer runs a C++ hook after each parameter's gradient
accumulator and all-reduces a bucket from there. This recorder puts a ``register_post_accumulate_grad_hook`` on every
parameter, which autograd runs inside that same accumulator, after the gradient is written and before the node's
post hooks (the reducer's). So on `checks.probes.clock` a parameter's "ready" tick comes before any all-reduce
that its gradient completes, and after every all-reduce that an earlier gradient completed: "bucket 0 was
all-reduced before the last gradient was computed" is an order of ``seq`` values.

It returns an `EventLog` the timeline draws like FSDP's (`reader.views.lanes`): each forward of ``model`` is a
``root_pre_forward`` event of unit ``ddp`` (a forward pre-hook, so before DDP's own ``_pre_forward`` and the
rebuild's broadcasts), and opens the next iteration; each ready gradient is a ``post_backward`` event whose unit is
the parameter's name (cleaned, without DDP's ``module.``), with ``detail="grad ready"`` and ``target`` its index
in ``model.parameters()`` order. A tied parameter is one parameter, ready once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch.distributed as dist
from torch import nn

from checks.naming import clean
from checks.probes import clock
from checks.probes.event_log import EventLog, FsdpEvent
from checks.ranks import capture

DDP_UNIT = "ddp"
READY = "grad ready"


@contextmanager
def record_grad_ready(model: nn.Module) -> Iterator[EventLog]:
    """Record ``model``'s forwards and its parameters' ready gradients in the block (see the module docstring)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    log = EventLog(rank=rank, world_size=dist.get_world_size() if dist.is_initialized() else 1)
    inner = getattr(model, "module", model)  # DDP's parameters, named as the wrapped model names them
    iteration = [0]

    def emit(kind: str, unit: str, state: str, **fields: Any) -> None:
        index, at = len(log.events) + 1, max(iteration[0], 1)
        log.events.append(FsdpEvent(index, at, kind, unit, state, api="ddp", rank=rank, seq=clock.tick(), **fields))

    def forward_began(module: nn.Module, args: Any) -> None:
        iteration[0] += 1
        emit("root_pre_forward", DDP_UNIT, "FORWARD")

    handles = [model.register_forward_pre_hook(forward_began)]
    for index, (name, param) in enumerate(inner.named_parameters()):
        if param.requires_grad:
            handles.append(param.register_post_accumulate_grad_hook(_ready(emit, clean(name), index)))
    try:
        yield log
    finally:
        for handle in handles:
            handle.remove()
        log.completed_iterations = iteration[0]
        capture.add(log)


def _ready(emit: Any, name: str, index: int) -> Any:
    def hook(param: Any) -> None:
        emit("post_backward", name, "BACKWARD", target=str(index), detail=READY)

    return hook


def ready_order(log: EventLog, iteration: int) -> list[int]:
    """Parameter indices in the order their gradients became ready in ``iteration``."""
    return [int(e.target or -1) for e in log.select("post_backward", iteration=iteration) if e.detail == READY]
