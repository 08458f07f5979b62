"""What one unit's ``_reduce_grad`` did to the data: the unsharded gradient, the reduce-scatter's input and
output, and the reduced shard, copied where torch hands them over (guide 08's padding and divide-factor claims)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from checks.ranks import tracing
from checks.ranks.symbols import code_objects
from checks.workloads.gpt import units

_RU = "torch.distributed.fsdp._runtime_utils"


@dataclass
class Reduction:
    """One unit's ``_reduce_grad`` as the data saw it: the unsharded gradient it started from, the reduce-scatter's
    input and output, and the reduced shard it ended with (after the post-divide)."""

    unit: str
    unsharded: torch.Tensor
    scatter_in: list[torch.Tensor] = field(default_factory=list)
    scatter_out: list[torch.Tensor] = field(default_factory=list)
    reduced: torch.Tensor | None = None


@contextmanager
def observed_reductions(model: nn.Module) -> Iterator[list[Reduction]]:
    """Every ``_reduce_grad`` in the block, in call order, with copies of the tensors it passed through (a tracer on
    ``_reduce_grad`` and ``dist.reduce_scatter_single``, so the data is read where torch hands it over, not from
    any attribute FSDP keeps)."""
    names = {id(unit._handle): name for name, unit in units(model).items() if unit._handle is not None}
    seen: list[Reduction] = []
    (reduce_code,) = code_objects(f"{_RU}:_reduce_grad")
    (scatter_code,) = code_objects("torch.distributed.distributed_c10d:reduce_scatter_single")

    def on_reduce(frame: Any) -> tracing.ReturnHook:
        handle = frame.f_locals["handle"]
        seen.append(Reduction(names.get(id(handle), "?"), handle.flat_param.grad.detach().clone()))

        def done(frame: Any, value: Any) -> None:
            shard = frame.f_locals.get("new_sharded_grad")
            seen[-1].reduced = None if shard is None else shard.detach().clone()

        return done

    def on_scatter(frame: Any) -> tracing.ReturnHook:
        output, given = frame.f_locals["output"], frame.f_locals["input"].detach().clone()

        def done(frame: Any, value: Any) -> None:
            if seen:
                seen[-1].scatter_in.append(given)
                seen[-1].scatter_out.append(output.detach().clone())

        return done

    # the trace function, not `checks.probes.calls`: `done` reads _reduce_grad's own local at its return
    with tracing.subscribed({reduce_code: on_reduce, scatter_code: on_scatter}) as subscription:
        yield seen
    if subscription.errors:
        raise RuntimeError(f"the reduction recorder failed: {subscription.errors[0]!r}") from subscription.errors[0]
