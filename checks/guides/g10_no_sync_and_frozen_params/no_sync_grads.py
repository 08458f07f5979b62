"""Guide 10's gradients inside ``no_sync``: the whole unsharded gradient of the flat parameter as built, kept in
``.grad`` with views for the original parameters, and accumulated to the whole batch's gradient."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from checks.guides.g10_no_sync_and_frozen_params.layouts import gpt_flat_params
from checks.models.flat_param import FlatParamSpec, Param, flat_param
from checks.naming import ROOT, clean
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads import toy
from checks.workloads.gpt import batch, fsdp1_gpt, grad_shards, units
from mini_gpt import GPT, BatchSampler, corpus_tokens, preset

MICRO_BATCHES = 2


def _original_grad_shapes(model: nn.Module) -> dict[str, list[int] | None]:
    return {clean(n): None if p.grad is None else list(p.grad.shape) for n, p in model.named_parameters()}


def _model_shapes() -> dict[str, list[int]]:
    """Each original parameter's shape, from the model built on the meta device (no FSDP involved)."""
    with torch.device("meta"):
        model = GPT(preset("tiny"))
    return {name: list(p.shape) for name, p in model.named_parameters()}


_QKV = "blocks.0.attn.qkv.weight"


def no_sync_keeps_unsharded_grad(ctx: RankContext) -> dict[str, Any]:
    """After a backward inside ``no_sync`` every unit's flat parameter is back to its shard, but its ``.grad`` is
    the whole unsharded gradient of this rank's batch: the flat parameter's length as built (the spec's
    ``flat_numel``, torch's ``_unpadded_unsharded_size``), not the shard; no reduced shard is saved; and every
    original parameter's ``.grad`` is a view of its full shape."""
    model = fsdp1_gpt(ctx)
    with model.no_sync():
        model(*batch(ctx))[1].backward()
    flats = gpt_flat_params(ctx.world_size)
    handles = {name: unit._handle for name, unit in units(model).items()}
    observed = {
        "grad": {n: h.flat_param.grad.numel() if h.flat_param.grad is not None else None for n, h in handles.items()},
        "param": {n: h.flat_param.numel() for n, h in handles.items()},
        "saved_shard": sorted(n for n, h in handles.items() if hasattr(h.flat_param, "_saved_grad_shard")),
    }
    expected = {
        "grad": {n: flats[n].flat_numel for n in handles},
        "param": {n: flats[n].shard_numel for n in handles},
        "saved_shard": [],
    }
    for key, reason in (("grad", "grad-size"), ("param", "param-size"), ("saved_shard", "saved-shard")):
        require_equal(observed[key], expected[key], reason=reason, what=f"rank {ctx.rank} after no_sync: {key}")
    views = _original_grad_shapes(model)
    require_equal(views, _model_shapes(), reason="grad-views", what="original parameters' .grad shapes")
    # The parameters themselves are back to 1-D views of the shard (guide 03): gradient and parameter differ.
    ranks = sorted({p.dim() for p in model.parameters()})
    require_equal(ranks, [1], reason="params-not-sharded", what="dimensions of the original parameters")
    qkv = {clean(n): p for n, p in model.named_parameters()}[_QKV]
    observed["qkv"] = {"param": list(qkv.shape), "grad": list(qkv.grad.shape)}
    return observed


def _toy_flat_params(world_size: int, use_orig_params: bool) -> dict[str, FlatParamSpec]:
    """The toy's three units by the spec: children ``0`` and ``1``, and the root holding layer ``2``."""
    return {
        unit: flat_param([Param("weight", (o, i)), Param("bias", (o,))], world_size, use_orig_params=use_orig_params)
        for unit, (i, o) in zip(("0", "1", ROOT), toy.TOY_LAYERS, strict=True)
    }


def no_sync_grad_is_flat_param_as_built(ctx: RankContext, use_orig_params: bool, backwards: int = 2) -> dict[str, Any]:
    """The gradient kept inside ``no_sync`` has the length of the flat parameter as built, after every no_sync
    backward: on four ranks the toy's root holds 30 elements, which ``use_orig_params=False`` pads to 32 only when
    sharding (the gradient has 30), and ``use_orig_params=True`` aligns and pads inside the flat parameter (the
    gradient has the spec's 36). Never a shard."""
    model = toy.wrap_fsdp1(toy.toy_model(ctx.device), ctx, use_orig_params=use_orig_params)
    named = {"0": getattr(model, "0"), "1": getattr(model, "1"), ROOT: model}  # the root keeps layer 2
    flats = _toy_flat_params(ctx.world_size, use_orig_params)
    seen: dict[str, list[int | None]] = {u: [] for u in named}
    with model.no_sync():
        for step in range(backwards):
            model(toy.toy_batch(ctx, step=step)).sum().backward()
            for u, m in named.items():
                grad = m._handle.flat_param.grad
                seen[u].append(None if grad is None else grad.numel())  # type: ignore[arg-type]
    expected = {u: [flats[u].flat_numel] * backwards for u in named}
    require_equal(seen, expected, reason="grad-size", what=f"rank {ctx.rank}: no_sync gradient lengths per backward")
    return {
        "grad": seen,
        "padded": {u: f.padded_unsharded_numel for u, f in flats.items()},
        "shard": {u: f.shard_numel for u, f in flats.items()},
    }


def _reference_grads(ctx: RankContext, steps: range, seed: int = 0) -> dict[str, torch.Tensor]:
    """The gradient of the mean loss over every row of every micro-batch's global batch, from one unwrapped model
    in this process: no FSDP, no collective."""
    sampler = BatchSampler(corpus_tokens(), preset("tiny").block_size, 8)
    xs, ys = zip(*(sampler.global_batch(step) for step in steps), strict=True)
    model = GPT(preset("tiny"), seed=seed).to(ctx.device)
    model(torch.cat(xs).to(ctx.device), torch.cat(ys).to(ctx.device))[1].backward()
    return {name: p.grad for name, p in model.named_parameters()}


def accumulated_grad_is_whole_batch(ctx: RankContext, rtol: float = 1e-5) -> dict[str, Any]:
    """Micro-batch 0 inside ``no_sync``, micro-batch 1 outside, each loss scaled by 1/2: each unit's sharded
    gradient is this rank's slice of the gradient of the mean loss over both global batches (16 rows), computed by
    an unwrapped model in one backward, within ``rtol`` of the unit's largest gradient."""
    model = fsdp1_gpt(ctx)
    for step in range(MICRO_BATCHES):
        x, y = batch(ctx, step=step)
        if step < MICRO_BATCHES - 1:
            with model.no_sync():
                model(x, y)[1].div(MICRO_BATCHES).backward()
        else:
            model(x, y)[1].div(MICRO_BATCHES).backward()
    want = grad_shards(_reference_grads(ctx, range(MICRO_BATCHES)), ctx.world_size, ctx.rank)
    observed = {}
    for name, unit in units(model).items():
        got = unit._handle.flat_param.grad.detach().cpu()
        require_equal(list(got.shape), list(want[name].shape), reason="shard-shape", what=f"{name} shard", unit=name)
        diff, scale = (got - want[name]).abs().max().item(), want[name].abs().max().item()
        observed[name] = {"max_abs_diff": diff, "max_abs_grad": scale, "relative": diff / scale}
        message = f"rank {ctx.rank} {name}: max |FSDP − reference| {diff:.3g} exceeds {rtol:g} × {scale:.3g}"
        require(diff <= rtol * scale, "beyond-tolerance", message, unit=name, bound=rtol * scale, **observed[name])
    return {"units": observed, "worst": max(d["relative"] for d in observed.values())}
