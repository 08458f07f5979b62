"""Guide 10's frozen parameters: a frozen unit resharded by the reshard-only hook or the catch-all (expect
`frozen-middle`, `frozen-root`), and a frozen parameter inside a trainable unit that never gets a ``.grad``."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp import _runtime_utils as ru

from checks.expected import Expected
from checks.guides.g10_no_sync_and_frozen_params.layouts import gpt_flat_params
from checks.guides.g10_no_sync_and_frozen_params.recording import backward_order, held_bytes, recorded_step
from checks.naming import ROOT, clean
from checks.ranks import capture
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.gpt import batch, ddp_gpt, ddp_grads, flat_grad_shards, grad_shards, unit_of_parameter, units
from mini_gpt import GPT, preset
from mini_gpt.train import make_optimizer


@contextmanager
def _sources() -> Iterator[None]:
    """Make the event recorder attribute torch source lines (`checks.ranks.capture`) inside the block, and hand
    what it recorded on to an outer capture (``fsdp-readings timeline``) if there is one."""
    if capture.active():
        yield
        return
    with capture.collecting():
        yield


def _function_at(source: str) -> str:
    """The `_runtime_utils` function whose body holds the line ``source`` (``…/_runtime_utils.py:799``)."""
    if not source.startswith("torch/distributed/fsdp/_runtime_utils.py:"):
        return source or "?"
    line = int(source.rsplit(":", 1)[1])
    for name in ("_post_backward_reshard", "_catch_all_reshard", "_post_forward_reshard"):
        lines, first = inspect.getsourcelines(getattr(ru, name))
        if first <= line < first + len(lines):
            return name
    return source


# -- 3. frozen units -----------------------------------------------------------------------------------------------
def _gpt_with_frozen_unit(ctx: RankContext, frozen: str, strategy: str = "FULL_SHARD") -> FSDP:
    """mini_gpt wrapped as in `checks.workloads.gpt.fsdp1_gpt`, with every parameter of unit ``frozen`` set not to
    require grad before wrapping, so its flat parameter does not require grad either."""
    model = GPT(preset("tiny"), seed=0).to(ctx.device)
    names = {ROOT, *(f"blocks.{i}" for i in range(len(model.blocks)))}
    for name, param in model.named_parameters():
        if unit_of_parameter(name, names) == frozen:
            param.requires_grad_(False)
    options = {"device_id": ctx.device, "use_orig_params": True, "sharding_strategy": ShardingStrategy[strategy]}
    for i, block in enumerate(model.blocks):
        model.blocks[i] = FSDP(block, **options)
    return FSDP(model, **options)


def frozen_unit_reshards(ctx: RankContext, frozen: str, expected: Expected) -> dict[str, Any]:
    """One FULL_SHARD step with unit ``frozen`` frozen: the backward's hooks, frees, reductions and final callback
    come in the ``expected`` order (the guide's expect block, one event a row), the frozen unit gets no gradient,
    and its free is issued from the function the order implies: `_post_backward_reshard` when the reshard-only hook
    ran for it, `_catch_all_reshard` when the free comes after the final callback."""
    model = _gpt_with_frozen_unit(ctx, frozen)
    with _sources():
        comm, events = recorded_step(model, *batch(ctx))
    order = backward_order(events)
    expected.require_rows(order, reason="frozen-timing", what=f"backward with {frozen} frozen")
    frees = [e for e in events if e.kind == "free" and e.unit == frozen and e.state != "FORWARD"]
    issued_by = [_function_at(e.source) for e in frees]
    late = order.index(f"free {frozen}") > order.index(f"final_callback {ROOT}")
    want = ["_catch_all_reshard" if late else "_post_backward_reshard"]
    require_equal(issued_by, want, reason="frozen-free-source", what=f"function that freed {frozen} in backward")
    grad = units(model)[frozen]._handle.flat_param.grad
    require(grad is None, "frozen-has-grad", f"the frozen {frozen} has a gradient of {grad.numel() if grad else 0}")
    reduced = sorted(e.unit for e in events.select("reduce_grad"))
    require_equal(reduced, sorted(set(units(model)) - {frozen}), reason="frozen-reduced", what="units reduced")
    held = held_bytes(model)
    require_equal(held, dict.fromkeys(held, 0), reason="held-after-backward", what="unsharded bytes after backward")
    return {"order": order, "freed_by": issued_by[0], "reduce_scatters": comm.count("reduce_scatter")}


# -- 4. a frozen parameter inside a trainable unit ------------------------------------------------------------------
def _gpt_with_frozen_parameter(ctx: RankContext, frozen: str) -> FSDP:
    """mini_gpt wrapped as `fsdp1_gpt` does (``use_orig_params=True``), with the one parameter ``frozen`` set not to
    require grad before wrapping: its unit's flat parameter still requires grad, for the others."""
    model = GPT(preset("tiny"), seed=0).to(ctx.device)
    dict(model.named_parameters())[frozen].requires_grad_(False)
    options = {"device_id": ctx.device, "use_orig_params": True}
    for i, block in enumerate(model.blocks):
        model.blocks[i] = FSDP(block, **options)
    return FSDP(model, **options)


def _split_in_torch(model: FSDP, unit: str, frozen: str) -> int:
    """How many of ``frozen``'s elements this rank's shard holds, by torch's own ``_shard_param_infos``."""
    flat_param = units(model)[unit]._handle.flat_param
    found = [
        info.numel_in_shard if info.in_shard else 0
        for fqn, info in zip(flat_param._fqns, flat_param._shard_param_infos, strict=True)
        if frozen == (clean(fqn) if unit == ROOT else f"{unit}.{clean(fqn)}")
    ]
    require_equal(len(found), 1, reason="frozen-not-found", what=f"{frozen} in {unit}'s flat parameter")
    return found[0]


def frozen_parameter_gets_no_grad(
    ctx: RankContext, frozen: str, shard_elements: list[int], steps: int = 2
) -> dict[str, Any]:
    """With ``use_orig_params=True`` a frozen parameter that shares a flat parameter with trainable ones never
    gets a ``.grad``, on any rank, after any backward, and AdamW never sees one: after ``steps`` steps it holds no
    state for it and the parameter is bit for bit what it was, while every trainable parameter of its unit moved.
    Its elements of the unit's flat gradient are computed and reduced all the same: the sharded flat gradient after
    the first backward is, bit for bit (N=2), this rank's slice of DDP's gradient of the same model with nothing
    frozen, the frozen parameter's piece included (the flat-parameter model places it)."""
    model = _gpt_with_frozen_parameter(ctx, frozen)
    unit = unit_of_parameter(frozen, set(units(model)))
    # ``shard_elements``: the guide's split of the frozen parameter over the ranks' shards, which the flat-parameter
    # model gives and torch's own shard metadata must hold on every rank.
    spec = gpt_flat_params(ctx.world_size)[unit]
    index = [clean(f) for f in spec.fqns].index(frozen)
    modelled = [(infos[index].numel_in_shard if infos[index].in_shard else 0)
                for infos in (spec.shard_param_infos(r) for r in range(ctx.world_size))]  # fmt: skip
    require_equal(modelled, shard_elements, reason="frozen-split-model", what=f"{frozen} per rank, by the model")
    split = ctx.gather(_split_in_torch(model, unit, frozen))
    require_equal(split, shard_elements, reason="frozen-split", what=f"{frozen} per rank, by torch's shard metadata")
    originals = {clean(n): p for n, p in model.named_parameters()}
    with FSDP.summon_full_params(model, writeback=False):
        before = {n: p.detach().clone() for n, p in originals.items()}
    optim = make_optimizer(model, 1e-3)
    grads_seen: list[str] = []
    for step in range(steps):
        optim.zero_grad(set_to_none=True)
        model(*batch(ctx, step=step))[1].backward()
        if originals[frozen].grad is not None:
            grads_seen.append(f"after backward {step + 1}")
        if step == 0:
            shards = flat_grad_shards(model)
        optim.step()
        if originals[frozen].grad is not None:
            grads_seen.append(f"after step {step + 1}")
    require_equal(grads_seen, [], reason="frozen-has-grad", what=f"rank {ctx.rank}: when {frozen} had a .grad")
    stateful = sorted(n for n, p in originals.items() if optim.state.get(p))
    require(frozen not in stateful, "optimizer-saw-frozen", f"AdamW keeps state for {frozen}", observed=stateful)
    with FSDP.summon_full_params(model, writeback=False):
        moved = sorted(n for n, p in originals.items() if not torch.equal(p, before[n]))
    require_equal(moved, sorted(set(before) - {frozen}), reason="frozen-moved", what="parameters the steps changed")
    ddp = ddp_gpt(ctx)
    ddp(*batch(ctx, step=0))[1].backward()
    want = grad_shards(ddp_grads(ddp), ctx.world_size, ctx.rank)[unit]
    require(torch.equal(shards[unit], want), "flat-grad-differs", f"rank {ctx.rank}: {unit}'s sharded flat gradient "
            "is not DDP's slice with nothing frozen")  # fmt: skip
    info = dict(zip([clean(f) for f in spec.fqns], spec.shard_param_infos(ctx.rank), strict=True))[frozen]
    piece = shards[unit][info.offset_in_shard : info.offset_in_shard + info.numel_in_shard] if info.in_shard else None
    return {
        "unit": unit,
        "frozen_elements_here": info.numel_in_shard if info.in_shard else 0,
        "split": split,
        "frozen_piece_nonzero": int(piece.ne(0).sum()) if piece is not None else 0,
        "moved": len(moved),
        "stateful": len(stateful),
    }
