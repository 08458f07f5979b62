"""Guide 12's four properties of a drawn unit, (a) to (d), and the long run of all four: the real ``FlatParameter``
is the spec field by field; each rank holds its slice; ``summon_full_params`` gathers the originals back; one SGD
step leaves the shards as an unwrapped replica's step. Layouts come from the spec (`checks.models.flat_param`),
values from a replica built in the rank (`checks.workloads.drawn_unit`), never from FSDP."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import _runtime_utils as ru

from checks.guides.g12_flat_parameter.flat_values import (
    PADDING_VALUE,
    check_slice,
    expected_flat,
    fqns_with_ties,
    require_same_tensor,
    tensor_at,
)
from checks.models.flat_param import FlatParamSpec
from checks.models.flat_param_draws import describe, spec_of
from checks.ranks.context import RankContext
from checks.violation import require_equal
from checks.workloads.drawn_unit import build_unit, unit_batch, wrap_unit

LR = 0.25


# -- (a) the FlatParameter is the spec ------------------------------------------------------------------------------
def _real_fields(model: FSDP) -> list[tuple[str, Any]]:
    """The fields compared, in order, as plain data read off the real handle and its ``FlatParameter``."""
    handle = model._handle
    flat = handle.flat_param
    return [
        ("fqns", list(flat._fqns)),
        ("shapes", [list(s) for s in flat._shapes]),
        ("numels", list(flat._numels)),
        ("numels-with-padding", list(flat._numels_with_padding)),
        ("is-padding-mask", list(flat._is_padding_mask)),
        ("shared-param-infos", _ties(flat)),
        ("aligned-numel", handle._aligned_numel),
        ("unpadded-unsharded-size", flat._unpadded_unsharded_size.numel()),
        ("sharded-size", flat._sharded_size.numel()),
        ("shard-numel-padded", flat._shard_numel_padded),
        ("shard-param-infos", [tuple(i) for i in flat._shard_param_infos]),
        ("requires-grad", flat.requires_grad),
        ("view-shapes", {fqn: list(tensor_at(model.module, fqn).shape) for fqn in _view_fqns(model)}),
    ]


def _ties(flat: Any) -> list[tuple[str, str]]:
    """``(fqn, primary fqn)`` of each tied parameter, from ``_shared_param_infos``."""
    return [
        (f"{s.module_name}.{s.param_name}".lstrip("."), f"{s.prim_module_name}.{s.prim_param_name}".lstrip("."))
        for s in flat._shared_param_infos
    ]


def _view_fqns(model: FSDP) -> list[str]:
    flat = model._handle.flat_param
    return [*flat._fqns, *(f"{s.module_name}.{s.param_name}".lstrip(".") for s in flat._shared_param_infos)]


def _spec_fields(spec: FlatParamSpec, rank: int) -> dict[str, Any]:
    return {
        "fqns": list(spec.fqns),
        "shapes": [list(s) for s in spec.shapes],
        "numels": list(spec.numels),
        "numels-with-padding": list(spec.numels_with_padding),
        "is-padding-mask": list(spec.is_padding_mask),
        "shared-param-infos": [(t.fqn, t.prim_fqn) for t in spec.shared],
        "aligned-numel": spec.aligned_numel,
        "unpadded-unsharded-size": spec.flat_numel,
        "sharded-size": spec.shard_numel,
        "shard-numel-padded": spec.shard_numel_padded(rank),
        "shard-param-infos": [i.as_tuple() for i in spec.shard_param_infos(rank)],
        "requires-grad": spec.requires_grad,
        "view-shapes": {fqn: list(shape) for fqn, shape in spec.view_shapes(rank).items()},
        "padded-unsharded-size": spec.padded_unsharded_numel,
    }


def _compare_fields(model: FSDP, spec: FlatParamSpec, rank: int) -> dict[str, Any]:
    want = _spec_fields(spec, rank)
    seen: dict[str, Any] = {}
    for field, observed in _real_fields(model):
        seen[field] = observed
        require_equal(observed, want[field], reason=f"{field}-differs", what=f"rank {rank}: {field}", field=field)
    return seen


def _compare_padded_size(model: FSDP, spec: FlatParamSpec, rank: int) -> int:
    padded = model._handle.flat_param._padded_unsharded_size.numel()
    require_equal(
        padded,
        spec.padded_unsharded_numel,
        reason="padded-unsharded-size-differs",
        what=f"rank {rank}: padded-unsharded-size",
        field="padded-unsharded-size",
    )
    return padded


def matches_spec(ctx: RankContext, example: dict[str, Any]) -> dict[str, Any]:
    """Property (a): the drawn unit's real ``FlatParameter`` equals the spec field by field, padding included: the
    per-parameter tuples, the padding segments and mask, the tied parameters, the alignment, the three sizes, this
    rank's ``_shard_param_infos`` and ``_shard_numel_padded``, ``requires_grad`` and the originals' view shapes."""
    spec = spec_of(example, ctx.world_size)
    model = wrap_unit(ctx, example)
    seen = ctx.agreed(_compare_fields, model, spec, ctx.rank)
    ru._lazy_init(model, model)  # `_padded_unsharded_size` is set only here (the first forward would do it)
    seen["padded-unsharded-size"] = ctx.agreed(_compare_padded_size, model, spec, ctx.rank)
    return {"unit": describe(example), "flat_numel": spec.flat_numel, "shard": seen["sharded-size"]}


# -- (b) each rank holds its slice ----------------------------------------------------------------------------------
def holds_its_slice(ctx: RankContext, example: dict[str, Any]) -> dict[str, Any]:
    """Property (b): after wrapping, each rank's flat parameter is exactly its slice ``[r*c, (r+1)*c)`` of the
    concatenated original parameters, padding (42 inside, 0 from sharding) included, and with
    ``use_orig_params=True`` each original parameter is the values of its own piece."""
    spec = spec_of(example, ctx.world_size)
    replica = build_unit(example, ctx.device)
    model = wrap_unit(ctx, example)
    want = ctx.agreed(check_slice, model, spec, replica, ctx.rank, "after wrapping")
    return {
        "unit": describe(example),
        "shard_numel": want.numel(),
        "padding_in_shard": int((want == PADDING_VALUE).sum()),
    }


# -- (c) the all-gather gives the originals back ---------------------------------------------------------------------
def _check_unsharded(model: FSDP, spec: FlatParamSpec, replica: nn.Module, when: str) -> None:
    """Inside ``summon_full_params``: the padded unsharded flat parameter is the spec's layout of the replica's
    values, and every original (tied ones included) is the replica's parameter, shape and values."""
    with FSDP.summon_full_params(model, writeback=False):
        handle = model._handle
        padded = handle._get_padded_unsharded_flat_param()
        require_same_tensor(
            padded,
            expected_flat(spec, replica),
            reason="padded-unsharded-differs",
            what=f"{when}: padded unsharded flat parameter",
        )
        for fqn in fqns_with_ties(spec):
            require_same_tensor(
                tensor_at(model.module, fqn),
                tensor_at(replica, fqn).detach().float().cpu(),
                reason="unsharded-param-differs",
                what=f"{when}: {fqn}",
                fqn=fqn,
            )


def gathers_originals(ctx: RankContext, example: dict[str, Any]) -> dict[str, Any]:
    """Property (c): ``summon_full_params`` (the unshard path: all-gather into the padded unsharded flat parameter,
    then unflattened views) gives back every original parameter exactly, and the padded flat parameter is the
    spec's layout with its padding."""
    spec = spec_of(example, ctx.world_size)
    replica = build_unit(example, ctx.device)
    model = wrap_unit(ctx, example)
    ctx.agreed(_check_unsharded, model, spec, replica, "summon_full_params")
    return {"unit": describe(example), "padded_numel": spec.padded_unsharded_numel}


# -- (d) one optimizer step ------------------------------------------------------------------------------------------
def _reference_step(example: dict[str, Any], device: torch.device) -> nn.Module:
    """The unwrapped unit after one SGD step on the batch, computing in ``param_dtype`` like FSDP's mixed
    precision (a bf16 copy for forward and backward, its gradients applied to the fp32 parameters)."""
    replica = build_unit(example, device)
    x, idx = unit_batch(device)
    if example["param_dtype"] == "float32":
        replica(x, idx).backward()
        torch.optim.SGD(replica.parameters(), lr=LR).step()
        return replica
    low = build_unit(example, device).to(torch.bfloat16)
    low(x.to(torch.bfloat16), idx).backward()
    with torch.no_grad():
        for master, copy in zip(replica.parameters(), low.parameters(), strict=True):
            if copy.grad is not None:
                master.sub_(LR * copy.grad.float())
    return replica


def step_matches_unwrapped(ctx: RankContext, example: dict[str, Any]) -> dict[str, Any]:
    """Property (d): one forward, backward and SGD step of the wrapped unit on the same batch on every rank leaves
    each rank's shard as the slice of the unwrapped unit's updated parameters (padding untouched), and unflattens
    to exactly the unwrapped unit's parameters."""
    spec = spec_of(example, ctx.world_size)
    model = wrap_unit(ctx, example)
    x, idx = unit_batch(ctx.device)
    model(x, idx).backward()
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR).step()
    reference = _reference_step(example, ctx.device)
    ctx.agreed(check_slice, model, spec, reference, ctx.rank, "after one step")
    ctx.agreed(_check_unsharded, model, spec, reference, "after one step")
    moved = sum(
        int(not torch.equal(p, q))
        for p, q in zip(reference.parameters(), build_unit(example, ctx.device).parameters(), strict=True)
    )
    return {"unit": describe(example), "parameters_moved": moved}


def every_property(ctx: RankContext, example: dict[str, Any]) -> dict[str, Any]:
    """(a) to (d) on one drawn unit: the long run behind the ``slow`` marker."""
    return {
        "fields": matches_spec(ctx, example),
        "slice": holds_its_slice(ctx, example),
        "gather": gathers_originals(ctx, example),
        "step": step_matches_unwrapped(ctx, example),
    }
