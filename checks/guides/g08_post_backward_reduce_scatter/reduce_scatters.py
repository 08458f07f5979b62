"""Guide 08's reduce-scatters: one per unit, in post-backward order, of the padded unit size, issued from each
unit's post-backward hook; the toy's root padded with zeros to a multiple of N."""

from __future__ import annotations

from typing import Any

from checks.guides.g08_post_backward_reduce_scatter.reductions import observed_reductions
from checks.models.flat_param import layout
from checks.models.prefetch import backward_sequence
from checks.naming import ROOT
from checks.probes.by_unit import collectives_by_unit
from checks.probes.comm import record_comm
from checks.probes.events import record_events
from checks.probes.expect import assert_sequence
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads import toy
from checks.workloads.gpt import POST_FORWARD, batch, fsdp1_gpt, padded_sizes, post_backward_order


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
