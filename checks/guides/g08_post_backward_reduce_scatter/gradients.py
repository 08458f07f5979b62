"""Guide 08's gradient values: each sharded gradient is this rank's slice of DDP's mean gradient, divided by the
model's pre- and post-factors, summed over backwards without a step, reduced and stored in the policy's dtypes."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.fsdp import MixedPrecision

from checks.guides.g08_post_backward_reduce_scatter.reductions import observed_reductions
from checks.models import divide_factors
from checks.probes.comm import record_comm
from checks.ranks.context import RankContext
from checks.violation import Violation, require, require_equal
from checks.workloads.gpt import batch, ddp_gpt, ddp_grads, flat_grad_shards, fsdp1_gpt, grad_shards, units


def _differences(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> dict[str, dict[str, Any]]:
    """Per unit: shapes, whether bitwise equal, the largest absolute difference and the largest |gradient|."""
    out = {}
    for unit, expected in want.items():
        observed = got[unit]
        same_shape = observed.shape == expected.shape
        out[unit] = {
            "shape": list(observed.shape),
            "expected_shape": list(expected.shape),
            "bitwise": same_shape and torch.equal(observed, expected),
            "max_abs_diff": (observed - expected).abs().max().item() if same_shape else None,
            "max_abs_grad": expected.abs().max().item(),
        }
    return out


def sharded_grad_is_ddp_slice(ctx: RankContext, steps: int = 1, bitwise: bool = True, rtol: float = 0.0) -> dict:
    """After a backward on the same data, each unit's sharded flat gradient equals this rank's slice of DDP's
    averaged gradient, laid out by the flat-parameter model: bitwise (``bitwise``), or within ``rtol`` of the
    largest gradient magnitude of the unit."""
    fsdp, ddp = fsdp1_gpt(ctx), ddp_gpt(ctx)
    x, y = batch(ctx)
    fsdp(x, y)[1].backward()
    ddp(x, y)[1].backward()
    diffs = _differences(flat_grad_shards(fsdp), grad_shards(ddp_grads(ddp), ctx.world_size, ctx.rank))
    for unit, d in diffs.items():
        what = f"rank {ctx.rank} {unit}: sharded gradient shape"
        require_equal(d["shape"], d["expected_shape"], reason="shard-shape", what=what, unit=unit)
        if bitwise:
            message = f"rank {ctx.rank} {unit}: sharded gradient is not DDP's slice (max |Δ| {d['max_abs_diff']:.3g})"
            require(d["bitwise"], "not-bitwise", message, unit=unit, **d)
        else:
            bound = rtol * d["max_abs_grad"]
            message = (
                f"rank {ctx.rank} {unit}: max |FSDP − DDP| = {d['max_abs_diff']:.3g} exceeds {rtol:g} × the unit's "
                f"largest gradient {d['max_abs_grad']:.3g}"
            )
            require(d["max_abs_diff"] <= bound, "beyond-tolerance", message, unit=unit, bound=bound, **d)
    return {
        unit: {"bitwise": d["bitwise"], "max_abs_diff": d["max_abs_diff"], "relative": _relative(d)}
        for unit, d in diffs.items()
    }


def _relative(d: dict[str, Any]) -> float:
    return d["max_abs_diff"] / d["max_abs_grad"] if d["max_abs_grad"] else 0.0


def _factor(before: torch.Tensor, after: torch.Tensor, unit: str, where: str) -> float:
    """The one number ``before`` was divided by to give ``after``, element by element; a `Violation` when no single
    factor does (elements that are zero on either side say nothing). Dividing by a power of two is exact, so the
    ratios are exact too."""
    mask = (before != 0) & (after != 0)
    ratios = sorted({float(v) for v in torch.unique(before[mask].double() / after[mask].double())})
    zeros_agree = bool(((before == 0) == (after == 0)).all())
    message = f"{unit}: {where} is not the gradient divided by one factor (ratios {ratios[:4]})"
    require(len(ratios) == 1 and zeros_agree, "not-one-factor", message, unit=unit, where=where, ratios=ratios[:4])
    return ratios[0]


def divide_factors_multiply_to_n(ctx: RankContext) -> dict[str, Any]:
    """Every unit divides its gradient by the model's pre-factor before the reduce-scatter and by N / pre after it,
    observed on the data: the reduce-scatter's input is the unsharded gradient (zero-padded to the input's length)
    divided by one factor, and the reduced shard is the reduce-scatter's output divided by another. A factor of 1
    is the data unchanged."""
    model = fsdp1_gpt(ctx)
    loss = model(*batch(ctx))[1]
    with observed_reductions(model) as reductions:
        loss.backward()
    want = {"pre": divide_factors.predivide(ctx.world_size), "post": divide_factors.postdivide(ctx.world_size)}
    require(want["pre"] * want["post"] == ctx.world_size, "not-a-mean", f"{want} do not multiply to N")
    reduced = [r.unit for r in reductions]
    require_equal(
        sorted(reduced), sorted(units(model)), reason="units-reduced", what="units whose gradient was reduced"
    )
    observed = {}
    for r in reductions:
        require_equal(len(r.scatter_in), 1, reason="reduce-scatters", what=f"{r.unit}'s reduce-scatters", unit=r.unit)
        (given,), (summed,) = r.scatter_in, r.scatter_out
        if r.reduced is None:
            raise Violation("no-reduced-shard", f"{r.unit}: _reduce_grad left no reduced shard", unit=r.unit)
        padded = torch.nn.functional.pad(r.unsharded.reshape(-1), [0, given.numel() - r.unsharded.numel()])
        got = {
            "pre": _factor(padded, given, r.unit, "the reduce-scatter's input"),
            "post": _factor(summed, r.reduced, r.unit, "the reduced shard"),
        }
        require_equal(got, want, reason="divide-factors", what=f"{r.unit}'s divisions, observed", unit=r.unit)
        observed[r.unit] = got
    return {**want, "observed": observed}


def accumulation_sums_shards(ctx: RankContext) -> dict[str, bool]:
    """Two backwards without no_sync (no step, no zero_grad between them) leave each sharded gradient equal to
    the sum of the two backwards' expected shards, each computed from a fresh DDP step on its own batch."""
    fsdp = fsdp1_gpt(ctx)
    batches = [batch(ctx, step=0), batch(ctx, step=1)]
    for x, y in batches:
        fsdp(x, y)[1].backward()
    summed: dict[str, torch.Tensor] = {}
    for x, y in batches:
        ddp = ddp_gpt(ctx)
        ddp(x, y)[1].backward()
        for unit, shard in grad_shards(ddp_grads(ddp), ctx.world_size, ctx.rank).items():
            summed[unit] = summed[unit] + shard if unit in summed else shard
    diffs = _differences(flat_grad_shards(fsdp), summed)
    for unit, d in diffs.items():
        message = f"rank {ctx.rank} {unit}: the accumulated gradient is not the sum (max |Δ| {d['max_abs_diff']})"
        require(d["bitwise"], "not-summed", message, unit=unit, **d)
    return {unit: d["bitwise"] for unit, d in diffs.items()}


def reduce_and_stored_dtypes(ctx: RankContext) -> dict[str, dict[str, str]]:
    """Under param_dtype=bf16 the reduce-scatter runs in ``reduce_dtype`` when it is set and in bf16 when it is
    not; either way the gradient each unit finally stores is fp32, the parameters' own dtype."""
    seen = {}
    for label, reduce_dtype in (("reduce_dtype unset", None), ("reduce_dtype fp32", torch.float32)):
        policy = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
        model = fsdp1_gpt(ctx, mixed_precision=policy)
        x, y = batch(ctx)
        loss = model(x, y)[1]
        with record_comm() as comm:
            loss.backward()
        expected = "torch.bfloat16" if reduce_dtype is None else "torch.float32"
        reduced = sorted({c.dtype for c in comm.select("reduce_scatter")})
        require_equal(reduced, [expected], reason="reduce-dtype", what=f"{label}: reduce-scatter dtypes")
        stored = sorted({str(unit._handle.flat_param.grad.dtype) for unit in units(model).values()})
        require_equal(stored, ["torch.float32"], reason="stored-dtype", what=f"{label}: stored gradient dtypes")
        seen[label] = {"reduce_scatter": reduced[0], "stored": stored[0]}
    return seen
