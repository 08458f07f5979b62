"""Mixed precision and accumulation: the dtypes of each policy's all-gathers, reduce-scatters, reduce op, stored
gradients and waiting unsynced gradient, by the release's rule; and a backward without sync, which reduces
nothing and leaves the whole unsharded gradient for the next, synced one."""

from __future__ import annotations

from typing import Any

from torch import nn

from checks.expected import Expected
from checks.guides.g18_fsdp2_reshard_and_gradients.reductions import (
    DTYPES,
    compare_to_slices,
    divide_factors_seen,
    grads_by_name,
    rank_slices,
)
from checks.guides.g18_fsdp2_reshard_and_gradients.units import UNITS, groups
from checks.models import fsdp2_precision
from checks.models.divide_factors import fsdp2_factors
from checks.probes.comm import record_comm
from checks.ranks.context import RankContext
from checks.violation import require_equal
from checks.workloads.gpt import batch, ddp_gpt, fsdp2_gpt
from mini_gpt import GPT, preset

POLICIES = {"bf16/None": ("bfloat16", None), "bf16/fp32": ("bfloat16", "float32"), "None/fp16": (None, "float16")}


def _policy(param_dtype: str | None, reduce_dtype: str | None) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=DTYPES.get(param_dtype or ""), reduce_dtype=DTYPES.get(reduce_dtype or ""))


# The guide's table's columns after the policy: what each states, as `mixed_precision` observes it.
PRECISION_COLUMNS = {"gather": "all_gather", "reduce": "reduce_scatter", "op": "ops", "grads": "grads",
                     "waits": "waits"}  # fmt: skip


def mixed_precision(ctx: RankContext, expected: Expected, release: str) -> dict[str, Any]:
    """Each policy of the guide's table: one synced step (the all-gathers' and reduce-scatters' dtypes, the reduce
    op, the sharded gradients' dtype), then one backward under ``set_requires_gradient_sync(False)`` (the dtype the
    unsynced gradient waits in), against `checks.models.fsdp2_precision` under ``release``'s rule and the table."""
    out: dict[str, Any] = {}
    for row in expected:
        label = row.key
        param_dtype, reduce_dtype = POLICIES[label]
        model = fsdp2_gpt(ctx, mp_policy=_policy(param_dtype, reduce_dtype))
        x, y = batch(ctx)
        with record_comm() as comm, divide_factors_seen() as seen:
            model(x, y)[1].backward()
        want = fsdp2_precision.stages("float32", param_dtype, reduce_dtype, release=release)
        gathered = sorted({c.dtype.removeprefix("torch.") for c in comm.select("all_gather")})
        reduced = sorted({c.dtype.removeprefix("torch.") for c in comm.select("reduce_scatter")})
        grads = sorted({str(p.grad.dtype).removeprefix("torch.") for p in model.parameters()})
        ops = sorted({s[2] for s in seen})
        model.set_requires_gradient_sync(False)
        model(x, y)[1].backward()
        waits = _unsharded_grads(model)["dtypes"]
        observed = {"all_gather": gathered, "reduce_scatter": reduced, "grads": grads, "ops": ops, "waits": waits}
        op = fsdp2_factors(want.reduce_scatter, ctx.world_size)[2]
        modelled = {"all_gather": [want.all_gather], "reduce_scatter": [want.reduce_scatter],
                    "grads": [want.sharded_grad], "ops": [op], "waits": [want.accumulated]}  # fmt: skip
        require_equal(observed, modelled, reason="dtypes-differ", what=f"{label}: dtypes", policy=label)
        cells = {"policy": label, **{column: " ".join(observed[key]) for column, key in PRECISION_COLUMNS.items()}}
        stated = expected.cells(row)
        expected.require(cells == stated, row, "table-differs", f"{label}: the run's row {cells!r}, the guide's "
                         f"{stated!r}", observed=cells, expected=stated, policy=label)  # fmt: skip
        out[label] = observed
    return out


def _unsharded_grads(model: nn.Module) -> dict[str, Any]:
    """Bytes and dtypes of what waits between micro-batches: the unsharded parameters' gradients and the
    accumulated ones; and how many sharded gradients exist."""
    held, dtypes, places, seen = 0, set(), set(), set()
    for group in groups(model).values():
        for fsdp_param in group.fsdp_params:
            for place, grad in (("unsharded_param.grad", fsdp_param._unsharded_param.grad),
                                ("unsharded_accumulated_grad", fsdp_param.unsharded_accumulated_grad)):  # fmt: skip
                if grad is not None:
                    places.add(place)
                    dtypes.add(str(grad.dtype).removeprefix("torch."))
                    storage = grad.untyped_storage()
                    # Each storage once: in 2.15 `unsharded_accumulated_grad` is a property returning the
                    # unsharded parameter's own `.grad`, so the two places can hold one tensor.
                    if storage.data_ptr() not in seen:
                        seen.add(storage.data_ptr())
                        held += storage.nbytes()
    sharded = sum(p.grad is not None for p in model.parameters())
    return {"bytes": held, "dtypes": sorted(dtypes), "where": sorted(places), "sharded_grads": sharded}


def accumulate_without_sync(ctx: RankContext) -> dict[str, Any]:
    """Two micro-batches, the first under ``set_requires_gradient_sync(False)``: its backward reduce-scatters
    nothing and leaves every parameter's whole unsharded gradient on the rank (|θ| fp32 elements, no sharded
    gradient yet); the second reduce-scatters four times, and the sharded gradients are bitwise DDP's slices of
    the same two micro-batches under ``no_sync``. Under bf16 compute with fp32 reduction the waiting gradient is
    the model's dtype: fp32."""
    fsdp, ddp = fsdp2_gpt(ctx), ddp_gpt(ctx)
    micro = [batch(ctx, step=0), batch(ctx, step=1)]
    fsdp.set_requires_gradient_sync(False)
    loss = fsdp(*micro[0])[1]
    with record_comm() as first:
        loss.backward()
    waiting = _unsharded_grads(fsdp)
    theta = sum(p.numel() for p in GPT(preset("tiny"), seed=0).parameters())
    want = {"bytes": 4 * theta, "dtypes": ["float32"], "sharded_grads": 0}
    require_equal(len(first.select("reduce_scatter")), 0, reason="reduced-without-sync", what="backward 1's "
                  "reduce-scatters")  # fmt: skip
    held = {k: waiting[k] for k in want}  # `where` is reported, not required (see below)
    require_equal(held, want, reason="waiting-differs", what="gradients held between micro-batches")
    fsdp.set_requires_gradient_sync(True)
    loss = fsdp(*micro[1])[1]
    with record_comm() as second:
        loss.backward()
    require_equal(len(second.select("reduce_scatter")), len(UNITS), reason="not-reduced", what="backward 2's "
                  "reduce-scatters")  # fmt: skip
    with ddp.no_sync():
        ddp(*micro[0])[1].backward()
    ddp(*micro[1])[1].backward()
    result = compare_to_slices(fsdp, rank_slices(grads_by_name(ddp), fsdp, ctx), ctx, "accumulated")

    mixed = fsdp2_gpt(ctx, mp_policy=_policy("bfloat16", "float32"))
    mixed.set_requires_gradient_sync(False)
    mixed(*micro[0])[1].backward()
    stage = fsdp2_precision.stages("float32", "bfloat16", "float32")
    waiting_mixed = _unsharded_grads(mixed)
    # The dtype is the behaviour; which attribute holds the waiting gradient is torch's bookkeeping (2.13 moves
    # it to `unsharded_accumulated_grad`, 2.15 keeps it on the parameter), returned but not required.
    expected = {"dtypes": [stage.accumulated]}
    require_equal({k: waiting_mixed[k] for k in expected}, expected, reason="accumulated-dtype-differs",
                  what="bf16/fp32: the gradient waiting between micro-batches")  # fmt: skip
    return {"waiting": waiting, "waiting_mixed": waiting_mixed, **result}
