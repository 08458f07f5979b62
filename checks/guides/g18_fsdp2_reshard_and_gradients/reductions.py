"""What a gradient reduction chose and what it must give: the divide factors and reduce ops of every
``_get_gradient_divide_factors`` call, observed without patching, and each rank's sharded gradients against its
rows of the full gradients they should be (DDP's, or a formula's), bitwise."""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from checks.models.fsdp2_shards import row_range
from checks.ranks import tracing
from checks.ranks.context import RankContext
from checks.violation import require

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _op_name(op: Any) -> str:
    return getattr(op, "name", None) or str(op).split(".")[-1]


@contextmanager
def divide_factors_seen() -> Iterator[list[tuple[Any, ...]]]:
    """What every ``_get_gradient_divide_factors`` call inside the block returned, (pre, post, rs op, ar op) with
    ops by name: observed at return through the rank's trace multiplexer, nothing patched."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    seen: list[tuple[Any, ...]] = []

    def on_call(frame: types.FrameType) -> tracing.ReturnHook:
        def on_return(frame: types.FrameType, value: Any) -> None:
            if value is not None:
                pre, post, rs_op, ar_op = value
                seen.append((pre, post, _op_name(rs_op), _op_name(ar_op)))

        return on_return

    # the trace function, not `checks.probes.calls`: it sees what the name holds now, a break-it replacement too
    with tracing.subscribed({_fsdp_collectives._get_gradient_divide_factors.__code__: on_call}):
        yield seen


def grads_by_name(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n.removeprefix("module."): p.grad for n, p in model.named_parameters() if p.grad is not None}


def rank_slices(full: dict[str, torch.Tensor], model: nn.Module, ctx: RankContext) -> dict[str, torch.Tensor]:
    """This rank's rows of each full gradient, by the dim-0 chunk rule (`checks.models.fsdp2_shards`)."""
    out = {}
    for name, param in model.named_parameters():
        lo, hi = row_range(tuple(param.shape), ctx.world_size, ctx.rank)
        out[name] = full[name].detach()[lo:hi]
    return out


def compare_to_slices(
    model: nn.Module, expected: dict[str, torch.Tensor], ctx: RankContext, case: str
) -> dict[str, Any]:
    """Every sharded gradient (its DTensor's local tensor) equal to ``expected``'s slice, bitwise."""
    differs: dict[str, float] = {}
    for name, param in model.named_parameters():
        require(param.grad is not None, "no-gradient", f"{case}: {name} has no gradient", case=case, name=name)
        local = param.grad.to_local()
        want = expected[name].reshape(local.shape).to(local.dtype)
        if not torch.equal(local, want):
            differs[name] = (local.double() - want.double()).abs().max().item()
    require(not differs, "not-bitwise", f"{case}: rank {ctx.rank}'s sharded gradients differ from the expected "
            f"slices: {differs}", case=case, differs=differs)  # fmt: skip
    return {"parameters": len(expected), "bitwise": True}
