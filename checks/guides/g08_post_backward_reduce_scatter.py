"""Checks for guide 08, post-backward and reduce-scatter: what each rank's sharded gradient is, numerically.

The expected gradients never come from FSDP: a DDP replica of the same model (same seed, same per-rank batches)
gives the mean gradient, and the flat-parameter model (`checks.models.flat_param`) says where each parameter's
gradient sits in the unit's padded flat gradient and which slice is this rank's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision

from checks.breakit.exercises import Exercise
from checks.breakit.patches import wrapping
from checks.models import divide_factors
from checks.models.flat_param import layout
from checks.models.prefetch import backward_sequence
from checks.naming import ROOT, clean
from checks.probes import assert_sequence, record_comm, record_events
from checks.probes.by_unit import collectives_by_unit
from checks.ranks import tracing
from checks.ranks.context import RankContext
from checks.ranks.symbols import code_objects
from checks.violation import Violation, require, require_equal
from checks.workloads import toy
from checks.workloads.gpt import (
    POST_FORWARD,
    batch,
    ddp_gpt,
    ddp_grads,
    flat_grad_shards,
    fsdp1_gpt,
    fsdp2_gpt,
    grad_shards,
    padded_sizes,
    post_backward_order,
    units,
)

_RU = "torch.distributed.fsdp._runtime_utils"


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


# -- which unit a collective belongs to, and what a reduction did to the data --------------------------------------


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

    with tracing.subscribed({reduce_code: on_reduce, scatter_code: on_scatter}) as subscription:
        yield seen
    if subscription.errors:
        raise RuntimeError(f"the reduction recorder failed: {subscription.errors[0]!r}") from subscription.errors[0]


def one_reduce_scatter_per_unit(ctx: RankContext) -> dict[str, Any]:
    """One backward issues exactly one reduce-scatter per unit, in post-backward order (blocks.2 … root), each
    of the unit's padded unsharded size in fp32 and from `_reduce_grad`; nothing else is reduced, and no
    all-reduce runs. Each reduce-scatter is attributed to its unit (`collectives_by_unit`), so the order of the
    three equal-sized blocks is checked, not only the sizes."""
    model = fsdp1_gpt(ctx)
    x, y = batch(ctx)
    loss = model(x, y)[1]
    with record_comm() as comm, record_events(model) as events:
        loss.backward()
    sizes = padded_sizes(ctx.world_size, element_bytes=4)
    scatters = comm.select("reduce_scatter")
    expected = [f"{unit} {sizes[unit]}" for unit in post_backward_order()]
    observed = collectives_by_unit(comm, events, "reduce_scatter")
    assert_sequence(observed, expected, what="reduce-scatters (unit, elements)", reason="reduce-scatters")
    callers = sorted({c.caller.split(":")[1] for c in scatters})
    require_equal(callers, ["_reduce_grad"], reason="reduce-scatter-caller", what="reduce-scatter callers")
    dtypes = sorted({c.dtype for c in scatters})
    require_equal(dtypes, ["torch.float32"], reason="reduce-dtype", what="reduce-scatter dtypes")
    reductions = sorted({c.op for c in comm if c.op in ("all_reduce", "reduce_scatter")})
    require_equal(reductions, ["reduce_scatter"], reason="other-reduction", what="gradient reductions")
    return {
        "reduce_scatters": observed,
        "sizes": [c.numel for c in scatters],
        "shard": [c.numel // ctx.world_size for c in scatters],
    }


def toy_reduce_scatter_pads_to_n(ctx: RankContext) -> dict[str, list[int]]:
    """On the toy, whose root holds 30 elements, the root's reduce-scatter input is padded with zeros to a
    multiple of N (32 at N=4) and each rank receives an equal shard, its tail padding included."""
    model = toy.wrap_fsdp1(toy.toy_model(ctx.device), ctx)
    loss = model(toy.toy_batch(ctx)).sum()
    with record_comm() as comm, observed_reductions(model) as reductions:
        loss.backward()
    numels = {unit: [o * i, o] for unit, (i, o) in zip(("0", "1", "2"), toy.TOY_LAYERS, strict=True)}
    numels[ROOT] = numels.pop("2")  # the root keeps the last layer
    order = [
        line.split()[1] for line in backward_sequence(("0", "1", ROOT), "BACKWARD_PRE") if line.startswith("post_")
    ]
    flats = {unit: layout(numels[unit], 4, ctx.world_size, align=False) for unit in order}
    expected = [flats[unit].padded_numel for unit in order]
    scatters = comm.select("reduce_scatter")
    assert_sequence([c.numel for c in scatters], expected, what="toy reduce-scatter sizes", reason="reduce-scatters")
    shards = {unit: model if unit == ROOT else getattr(model, unit) for unit in order}
    got = {unit: shards[unit]._handle.flat_param.grad.numel() for unit in order}
    want = {unit: flats[unit].shard_numel for unit in order}
    require_equal(got, want, reason="shard-size", what="sharded gradient lengths")
    padding = {}
    for r in reductions:
        (given,) = r.scatter_in
        unpadded = flats[r.unit].unpadded_numel
        require_equal(r.unsharded.numel(), unpadded, reason="unsharded-size", what=f"{r.unit}'s unsharded gradient")
        tail = given[unpadded:]
        padding[r.unit] = tail.tolist()
        message = f"{r.unit}: the reduce-scatter input's padding {tail.tolist()} is not zeros"
        require(bool((tail == 0).all()), "padding-not-zero", message, unit=r.unit, padding=tail.tolist())
    return {
        "sizes": [c.numel for c in scatters],
        "unpadded": [flats[u].unpadded_numel for u in order],
        "shard": got,
        "padding": padding,
    }


def reduce_scatter_in_post_backward(ctx: RankContext) -> list[str]:
    """Each unit's reduce-scatter is issued from its own post-backward hook, right after its gradient exists and
    before autograd reaches the next unit: in the merged order of hooks and collectives, every
    ``post_backward U`` is followed at once by a reduce-scatter (the prefetch model gives the hook order)."""
    model = fsdp1_gpt(ctx)
    x, y = batch(ctx)
    loss = model(x, y)[1]
    with record_comm() as comm, record_events(model) as events:
        loss.backward()
    hooks = [(e.seq, f"{e.kind} {e.unit}") for e in events if e.kind in ("pre_backward", "post_backward")]
    scatters = [(c.seq, "reduce_scatter") for c in comm.select("reduce_scatter")]
    observed = [what for _, what in sorted(hooks + scatters)]
    expected = []
    for line in backward_sequence(POST_FORWARD, "BACKWARD_PRE"):
        if not line.startswith("prefetch"):
            expected.append(line)
        if line.startswith("post_backward"):
            expected.append("reduce_scatter")
    assert_sequence(observed, expected, what="backward hooks and reduce-scatters", reason="reduce-scatter-timing")
    return observed


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


# -- clip_grad_norm_ on sharded gradients --------------------------------------------------------------------------
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


# -- break-it recipes: this guide's behaviour bent on purpose (tests/break_it/ applies them) --------------


def sum_not_mean(original: Any, tensor: Any, div_factor: float) -> None:
    """``_div_if_needed`` that never divides: every rank's gradient is summed, not averaged."""


def reduce_scatter_twice(original: Any, output: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
    """``dist.reduce_scatter_single`` issued twice on the same input (the second result is kept)."""
    original(output, input, *args, **kwargs)
    return original(output, input, *args, **kwargs)


def overwrite_instead_of_accumulate(original: Any, state: Any, handle: Any, sharded_grad: Any) -> Any:
    """``_accumulate_sharded_grad`` that forgets the saved gradient shard, so a second backward overwrites it."""
    flat_param = handle.flat_param
    if hasattr(flat_param, "_saved_grad_shard"):
        del flat_param._saved_grad_shard
    return original(state, handle, sharded_grad)


def keep_reduced_dtype(original: Any, state: Any, sharded_grad: Any, param: Any) -> None:
    """``_cast_grad_to_param_dtype`` that leaves the gradient in the dtype it was reduced in."""


def without_postdivide(original: Any, state: Any, handle: Any) -> None:
    """``_reduce_grad`` with the post-divide factor forced to 1: the pre-divide alone is not a mean unless N = 2."""
    state._gradient_postdivide_factor = 1.0
    original(state, handle)


def reduce_in_fp32(original: Any, state: Any, handle: Any, *args: Any) -> Any:
    """``_post_backward_hook`` whose handle reduces in fp32 whatever the policy says."""
    handle._reduce_dtype = torch.float32
    return original(state, handle, *args)


_DEFERRED: list[tuple[Any, Any, Any]] = []


def defer_reduction(original: Any, state: Any, handle: Any) -> None:
    """``_reduce_grad`` that only remembers the unit; `reduce_deferred` reduces them all at the end."""
    _DEFERRED.append((original, state, handle))


def reduce_deferred(original: Any, state: Any, module: Any) -> None:
    """``_post_backward_final_callback`` that first reduces everything `defer_reduction` held back."""
    while _DEFERRED:
        reduce, unit_state, handle = _DEFERRED.pop(0)
        reduce(unit_state, handle)
    original(state, module)


_SWAP: dict[str, Any] = {"held": None, "done": False}


def reduce_first_two_swapped(original: Any, state: Any, handle: Any) -> None:
    """``_reduce_grad`` that holds back the first unit's reduction of a backward and issues it right after the
    second's (blocks.1 before blocks.2: the same sizes, another order); the root's, the last, ends the backward."""
    if _SWAP["held"] is None and not _SWAP["done"]:
        _SWAP["held"] = (state, handle)
        return
    original(state, handle)
    if _SWAP["held"] is not None:
        held_state, held_handle = _SWAP["held"]
        _SWAP["held"], _SWAP["done"] = None, True
        original(held_state, held_handle)
    if state._is_root:
        _SWAP["done"] = False


def pad_with_ones(original: Any, state: Any, unsharded_grad: Any) -> tuple[Any, Any]:
    """``_get_reduce_scatter_tensors`` that pads to the same length with ones instead of zeros."""
    padded, shard = original(state, unsharded_grad)
    if padded.numel() > unsharded_grad.numel():
        padded = padded.clone()
        padded[unsharded_grad.numel() :] = 1.0
    return padded, shard


def pad_a_chunk_more(original: Any, state: Any, unsharded_grad: Any) -> tuple[Any, Any]:
    """``_get_reduce_scatter_tensors`` that pads one whole chunk more than a multiple of N needs."""
    import torch.nn.functional as F

    padded, shard = original(state, unsharded_grad)
    extra = shard.numel() + 1
    return F.pad(padded, [0, extra * state.world_size]), torch.empty(shard.numel() + extra, dtype=shard.dtype)


def clip_without_all_reduce(original: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
    """``FullyShardedDataParallel.clip_grad_norm_`` whose all-reduce of the squared norms does nothing: each rank
    clips by the norm of its own shard."""
    import torch.distributed as dist

    all_reduce = dist.all_reduce
    dist.all_reduce = lambda *a, **k: None
    try:
        return original(model, *args, **kwargs)
    finally:
        dist.all_reduce = all_reduce


def clip_twice_on_rank_1(original: Any, model: Any, max_norm: float, *args: Any) -> Any:
    """``FullyShardedDataParallel.clip_grad_norm_`` after which rank 1 scales its shard by the factor once more."""
    norm = original(model, max_norm, *args)
    if model.rank == 1:
        factor = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(factor)
    return norm


def local_total_norm(original: Any, tensors: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.nn.utils.clip_grad._get_total_norm`` over each DTensor's local tensor: every rank gets the norm of
    its own shards, returned as a replicated DTensor, as if the DTensors' reduction were lost."""
    from torch.distributed.tensor import DTensor, Replicate

    tensors = list(tensors)
    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    norm = original(local, *args, **kwargs)
    mesh = next((t.device_mesh for t in tensors if isinstance(t, DTensor)), None)
    return norm if mesh is None else DTensor.from_local(norm, mesh, [Replicate()])


# -- exercises: recipes above as puzzles (fsdp-readings exercise 08-post-backward-reduce-scatter) ----------------


def clip_without_the_clamp_fsdp1(original: Any, self: Any, max_norm: float, norm_type: float = 2.0) -> Any:
    """FSDP1's ``clip_grad_norm_`` followed by the rest of the unclamped factor: every gradient is multiplied by
    ``max_norm / (norm + 1e-6)`` even when that is above 1."""
    norm = original(self, max_norm, norm_type)
    coef = max_norm / (norm + 1e-6)
    for param in self.parameters():
        if param.grad is not None:
            param.grad.mul_(coef / torch.clamp(coef, max=1.0))
    return norm


def clip_without_the_clamp(original: Any, parameters: Any, max_norm: float, total_norm: Any, *args: Any) -> None:
    """``_clip_grads_with_norm_`` with the factor left unclamped: gradients are scaled up below ``max_norm``."""
    coef = max_norm / (total_norm + 1e-6)
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    for param in params:
        if param.grad is not None:
            param.grad.mul_(coef)


EXERCISES = (
    Exercise(
        "sum-not-mean",
        claim="sharded-grad-is-ddp-slice",
        patches=(wrapping(f"{_RU}:_div_if_needed", sum_not_mean),),
        puzzle="`_div_if_needed` never divides. Training still runs and the loss still falls.",
        reason="not-bitwise",
    ),
    Exercise(
        "reduce-at-the-end",
        claim="reduce-scatter-in-post-backward",
        patches=(
            wrapping(f"{_RU}:_reduce_grad", defer_reduction),
            wrapping(f"{_RU}:_post_backward_final_callback", reduce_deferred),
        ),
        puzzle="`_reduce_grad` only remembers each unit; the final callback reduces them all at the end of backward.",
        reason="reduce-scatter-timing",
    ),
    Exercise(
        "no-post-divide-on-4",
        claim="sharded-grad-close-to-ddp-at-4",
        patches=(wrapping(f"{_RU}:_reduce_grad", without_postdivide),),
        puzzle="`_reduce_grad` runs with the post-divide factor forced to 1. Which claim notices, on 2 or on 4 ranks?",
        reason="beyond-tolerance",
    ),
)
