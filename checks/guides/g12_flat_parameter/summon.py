"""Guide 12's summon_full_params claims: what ``writeback`` keeps (each rank's own shard of an edit, parameters
and, ``with_grads``, gradients) and what ``rank0_only`` gives each rank, on the guide's unit on two ranks
(`checks.workloads.drawn_unit.LAYOUT_UNIT`). Expected values are the unwrapped unit's, shifted by the edits, in the
spec's layout; the collectives are the spec's padded size."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from checks.guides.g12_flat_parameter.flat_values import (
    check_slice,
    expected_flat,
    laid_out,
    require_same_tensor,
    tensor_at,
)
from checks.models.flat_param import FlatParamSpec
from checks.models.flat_param_draws import spec_of
from checks.probes.comm import record_comm
from checks.ranks.context import RankContext
from checks.violation import Violation, require_equal
from checks.workloads.drawn_unit import LAYOUT_UNIT, build_unit, unit_batch, wrap_unit


def _shifted(spec: FlatParamSpec, replica: nn.Module, by: float) -> nn.Module:
    """``replica`` with ``by`` added to every flattened parameter (a tied one is the same tensor: once)."""
    with torch.no_grad():
        for fqn in spec.fqns:
            tensor_at(replica, fqn).add_(by)
    return replica


def _edit(model: FSDP, spec: FlatParamSpec, by: float, grads: bool) -> None:
    """Add ``by`` to every flattened original parameter of the unwrapped view (and to its ``.grad``)."""
    with torch.no_grad():
        for fqn in spec.fqns:
            tensor = tensor_at(model.module, fqn)
            tensor.add_(by)
            if grads:
                tensor.grad.add_(by)


def _grads_of(spec: FlatParamSpec, replica: nn.Module, plus: float = 0.0) -> dict[str, torch.Tensor]:
    return {fqn: tensor_at(replica, fqn).grad + plus for fqn in spec.fqns}


def _check_grad_slice(model: FSDP, spec: FlatParamSpec, grads: dict[str, torch.Tensor], rank: int, when: str) -> None:
    """This rank's sharded ``flat_param.grad`` is its slice of ``grads`` laid out (0 in every padding segment:
    padding is never used, so it gets a zero gradient)."""
    lo, hi = spec.shard_range(rank)
    want = laid_out(spec, grads, 0.0)[lo:hi]
    require_same_tensor(model._handle.flat_param.grad, want, reason="local-grad-differs",
                        what=f"rank {rank} {when}: sharded gradient [{lo}, {hi})")  # fmt: skip


def _check_full_grads(inside: dict[str, torch.Tensor | None], want: dict[str, torch.Tensor]) -> None:
    """Inside ``summon_full_params(with_grads=True)`` each original's ``.grad`` is the whole gradient."""
    for fqn, grad in inside.items():
        if grad is None:
            raise Violation("unsharded-grad-differs", f"{fqn}.grad is None inside the context", fqn=fqn)
        require_same_tensor(grad, want[fqn].cpu(), reason="unsharded-grad-differs", what=f"{fqn}.grad inside")


def summon_writeback(ctx: RankContext, with_grads: bool) -> dict[str, Any]:
    """``summon_full_params(writeback=True)`` keeps only each rank's own part of an edit. The unit of the
    layout diagram, after one backward on the same batch everywhere (exact values, so the gradients are the
    unwrapped unit's). First every rank adds 1 to every original parameter (and, ``with_grads``, to every
    gradient, which inside the context is the full one): afterwards every shard holds the edit. Then rank 0 alone
    adds 1 again: rank 0's shard keeps it, rank 1's does not, so a second summon shows rank 0's elements moved
    twice and rank 1's once: rank 0's edit to rank 1's elements is lost."""
    unit = {**LAYOUT_UNIT, "use_orig_params": True}
    spec = spec_of(unit, ctx.world_size)
    model, replica = wrap_unit(ctx, unit), build_unit(unit, ctx.device)
    x, idx = unit_batch(ctx.device)
    model(x, idx).backward()
    replica(x, idx).backward()
    with record_comm() as comm, FSDP.summon_full_params(model, writeback=True, with_grads=with_grads):
        inside = {fqn: tensor_at(model.module, fqn).grad for fqn in spec.fqns} if with_grads else {}
        inside = {fqn: None if grad is None else grad.detach().clone() for fqn, grad in inside.items()}
        _edit(model, spec, 1.0, with_grads)
    ctx.agreed(_check_full_grads, inside, _grads_of(spec, replica))
    once = _shifted(spec, build_unit(unit, ctx.device), 1.0)
    ctx.agreed(check_slice, model, spec, once, ctx.rank, "after every rank's edit")
    if with_grads:
        ctx.agreed(_check_grad_slice, model, spec, _grads_of(spec, replica, 1.0), ctx.rank, "after every rank's edit")
    with FSDP.summon_full_params(model, writeback=True, with_grads=with_grads):
        if ctx.rank == 0:
            _edit(model, spec, 1.0, with_grads)
    twice = _shifted(spec, build_unit(unit, ctx.device), 2.0)
    ctx.agreed(check_slice, model, spec, twice if ctx.rank == 0 else once, ctx.rank, "after rank 0's edit")
    if with_grads:
        mine = _grads_of(spec, replica, 2.0 if ctx.rank == 0 else 1.0)
        ctx.agreed(_check_grad_slice, model, spec, mine, ctx.rank, "after rank 0's edit")
    lo, hi = spec.shard_range(0)
    merged = torch.cat([expected_flat(spec, twice)[lo:hi], expected_flat(spec, once)[hi:]])
    with FSDP.summon_full_params(model, writeback=False):
        gathered = model._handle._get_padded_unsharded_flat_param().detach().clone()
    what = "the gathered flat parameter after rank 0's edit"
    ctx.agreed(partial(require_same_tensor, reason="edit-not-lost", what=what), gathered, merged)
    moved = (gathered - expected_flat(spec, once)).ne(0).sum().item()
    # `unshard_grad` adds an all-reduce of one flag ("are all gradients None?") and the gradient's all-gather.
    padded = spec.padded_unsharded_numel
    want_comm = [["all_gather", padded], *([["all_reduce", 1], ["all_gather", padded]] if with_grads else [])]
    what = "collectives of the first summon_full_params (op, elements)"
    issued = [[c.op, c.numel] for c in comm]
    ctx.agreed(partial(require_equal, reason="summon-collectives", what=what), issued, want_comm)
    return {"shard_numel": spec.shard_numel, "moved_twice": int(moved), "rank0_range": [lo, hi],
            "collectives": issued}  # fmt: skip


def _storage(model: FSDP) -> int:
    return model._handle.flat_param._full_param_padded.untyped_storage().nbytes()


def _check_rank_0_values(values: dict[str, torch.Tensor], replica: nn.Module, rank: int) -> None:
    """On rank 0, each original seen inside the context is the unwrapped unit's parameter (other ranks: nothing)."""
    if rank != 0:
        return
    for fqn, value in values.items():
        want = tensor_at(replica, fqn).detach().cpu()
        require_same_tensor(value, want, reason="rank-0-not-full", what=f"rank 0: {fqn} inside the context", fqn=fqn)


def summon_rank0_only(ctx: RankContext) -> dict[str, Any]:
    """``summon_full_params(rank0_only=True, writeback=False)``: every rank all-gathers, rank 0 sees every
    original parameter whole, with the unwrapped unit's values; every other rank frees the gathered buffer at
    once and sees its sharded 1-D views. With the default ``writeback=True``, ``rank0_only=True`` raises
    ``NotImplementedError`` on every rank before any collective."""
    unit = {**LAYOUT_UNIT, "use_orig_params": True}
    spec = spec_of(unit, ctx.world_size)
    model, replica = wrap_unit(ctx, unit), build_unit(unit, ctx.device)
    with record_comm() as comm, FSDP.summon_full_params(model, rank0_only=True, writeback=False):
        shapes = {fqn: list(tensor_at(model.module, fqn).shape) for fqn in spec.fqns}
        values = {fqn: tensor_at(model.module, fqn).detach().clone() for fqn in spec.fqns}
        held = _storage(model)
    full = {fqn: list(shape) for fqn, shape in zip(spec.fqns, spec.shapes, strict=True)}
    infos = zip(spec.fqns, spec.shard_param_infos(ctx.rank), strict=True)
    pieces = {fqn: [info.numel_in_shard or 0] for fqn, info in infos}
    padded_bytes = 4 * (spec.padded_unsharded_numel or 0)
    seen = {"shapes": shapes, "gathered_bytes": held, "all_gathers": comm.count("all_gather")}
    if ctx.rank == 0:
        want = {"shapes": full, "gathered_bytes": padded_bytes, "all_gathers": 1}
        reason = "rank-0-not-full"
    else:
        want = {"shapes": pieces, "gathered_bytes": 0, "all_gathers": 1}
        reason = "other-rank-unsharded"
    ctx.agreed(partial(require_equal, reason=reason, what=f"rank {ctx.rank} inside the context"), seen, want)
    ctx.agreed(_check_rank_0_values, values, replica, ctx.rank)
    with record_comm() as refused:
        try:
            with FSDP.summon_full_params(model, rank0_only=True):
                pass
        except NotImplementedError as error:
            message = str(error)
        else:
            message = ""
    said = {"raised": message, "collectives": len(refused)}
    want_said = {"raised": "writeback=True and rank0_only=True is not supported yet", "collectives": 0}
    what = "what summon_full_params(rank0_only=True) raised, and the collectives before"
    ctx.agreed(partial(require_equal, reason="writeback-rank0-only-allowed", what=what), said, want_said)
    gathers = seen["all_gathers"]
    return {"shapes": shapes, "gathered_bytes": held, "all_gathers": gathers, "refused": message}
