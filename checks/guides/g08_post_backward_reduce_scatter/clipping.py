"""Guide 08's clipping: ``clip_grad_norm_`` over sharded gradients returns the whole model's norm, scales every
rank by one factor (DDP's clipped gradients), and never scales up (FSDP1's method and FSDP2's DTensors)."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from checks.naming import clean
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.gpt import batch, ddp_gpt, fsdp1_gpt, fsdp2_gpt


def _clip(model: nn.Module, api: str, max_norm: float) -> tuple[torch.Tensor, float]:
    """The norm each API's clipping returns (the tensor itself, and its value): FSDP1's own method, or
    ``torch.nn.utils.clip_grad_norm_`` over FSDP2's DTensor parameters, whose norm comes back as a DTensor."""
    if api == "fsdp1":
        norm = model.clip_grad_norm_(max_norm)
        return norm, float(norm)
    from torch.distributed.tensor import DTensor, Replicate

    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    require(isinstance(norm, DTensor), "not-a-dtensor", f"the norm is a {type(norm).__name__}, not a DTensor")
    placements = [str(p) for p in norm.placements]
    require_equal(placements, [str(Replicate())], reason="norm-not-replicated", what="the norm's placements")
    return norm, float(norm.full_tensor())


def _local_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """This rank's gradient elements by parameter name (FSDP1: the original parameters' views of the shard; FSDP2:
    each DTensor gradient's local tensor)."""
    out = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            out[clean(name)] = grad.detach().clone()
    return out


def _full_grads(model: nn.Module, api: str) -> dict[str, torch.Tensor]:
    """Every parameter's whole gradient: FSDP2 through ``full_tensor()``, FSDP1 through
    ``summon_full_params(with_grads=True)`` (guide 12)."""
    if api == "fsdp2":
        return {clean(n): p.grad.full_tensor().detach().clone() for n, p in model.named_parameters()}
    with FSDP.summon_full_params(model, writeback=False, with_grads=True):
        return {clean(n): p.grad.detach().clone() for n, p in model.named_parameters()}


def clip_grad_norm_matches_ddp(ctx: RankContext, api: str, max_norm: float, rtol: float) -> dict[str, Any]:
    """After one backward on the same data, clipping the sharded gradients to ``max_norm`` returns the norm of the
    whole model's gradient, as DDP's ``torch.nn.utils.clip_grad_norm_`` over its replicated gradients does, within
    ``rtol`` (the two sum the squares in different orders); it multiplies every gradient element on every rank by
    one factor, ``max_norm / (norm + 1e-6)``, the same on all ranks; and the clipped gradients are DDP's clipped
    ones within ``rtol`` of each parameter's largest."""
    ddp = ddp_gpt(ctx)
    ddp(*batch(ctx))[1].backward()
    ddp_norm = float(torch.nn.utils.clip_grad_norm_(ddp.parameters(), max_norm))
    require(ddp_norm > max_norm, "nothing-clipped", f"DDP's norm {ddp_norm} is below {max_norm}: no clipping")
    model = fsdp1_gpt(ctx) if api == "fsdp1" else fsdp2_gpt(ctx)
    model(*batch(ctx))[1].backward()
    before = _local_grads(model)
    norm, value = _clip(model, api, max_norm)
    message = f"{api}'s norm {value!r} vs DDP's {ddp_norm!r}: beyond {rtol:g} relative"
    close = abs(value - ddp_norm) <= rtol * ddp_norm
    ctx.agreed(partial(require, close, "norm-differs", message, observed=value, expected=ddp_norm))
    local_norm = norm.to_local() if hasattr(norm, "to_local") else norm
    factor = torch.clamp(max_norm / (local_norm + 1e-6), max=1.0)  # the factor torch's code multiplies by
    after = _local_grads(model)
    unscaled = sorted(n for n, g in after.items() if not torch.equal(g, before[n] * factor.to(g.dtype)))
    what = f"rank {ctx.rank}: gradients not scaled by {float(factor)!r}"
    ctx.agreed(partial(require_equal, reason="not-one-factor", what=what, rank=ctx.rank), unscaled, [])
    factors = ctx.gather(float(factor))
    require(len(set(factors)) == 1, "factors-differ", f"clip factors per rank: {factors}", observed=factors)
    want = {clean(n.removeprefix("module.")): p.grad for n, p in ddp.named_parameters()}
    worst = {}
    for name, grad in _full_grads(model, api).items():
        diff = (grad - want[name]).abs().max().item()
        bound = rtol * want[name].abs().max().item()
        require(diff <= bound, "clipped-grads-differ", f"{name}: clipped gradient {diff:.3g} from DDP's, beyond "
                f"{bound:.3g}", name=name, max_abs_diff=diff, bound=bound)  # fmt: skip
        worst[name] = diff / want[name].abs().max().item() if diff else 0.0
    return {
        "norm": value,
        "ddp_norm": ddp_norm,
        "relative": abs(value - ddp_norm) / ddp_norm,
        "factor": float(factor),
        "worst_grad_relative": max(worst.values()),
        "norm_type": type(norm).__name__,
        "placements": str(getattr(norm, "placements", "")),
    }


def clip_never_scales_up(ctx: RankContext, api: str, max_norm: float) -> dict[str, Any]:
    """With ``max_norm`` above the whole model's gradient norm, clipping leaves every gradient element this rank
    holds bit for bit as it was: the factor ``max_norm / (norm + 1e-6)`` is above 1 and clamped to exactly 1."""
    model = fsdp1_gpt(ctx) if api == "fsdp1" else fsdp2_gpt(ctx)
    model(*batch(ctx))[1].backward()
    before = _local_grads(model)
    _, value = _clip(model, api, max_norm)
    unclamped = max_norm / (value + 1e-6)
    require(unclamped > 1.0, "norm-above-max", f"{api}'s norm {value!r} is not below max_norm {max_norm!r}",
            observed=value, max_norm=max_norm)  # fmt: skip
    after = _local_grads(model)
    scaled = sorted(n for n, g in after.items() if not torch.equal(g, before[n]))
    what = f"rank {ctx.rank}: gradients changed by a clip whose factor {unclamped:.6g} should be clamped to 1"
    ctx.agreed(partial(require_equal, reason="scaled-up", what=what, rank=ctx.rank), scaled, [])
    return {"norm": value, "max_norm": max_norm, "unclamped_factor": unclamped, "unchanged": len(after)}
