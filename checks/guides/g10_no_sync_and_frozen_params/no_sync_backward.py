"""Guide 10's backward inside ``no_sync``: FULL_SHARD frees each unit in its post-backward and reduces nothing;
SHARD_GRAD_OP keeps every unit unsharded until the next synced step."""

from __future__ import annotations

from typing import Any

from torch.distributed.fsdp import ShardingStrategy

from checks.guides.g10_no_sync_and_frozen_params.recording import backward_order, held_bytes, recorded_step
from checks.models.prefetch import backward_sequence
from checks.naming import ROOT
from checks.probes.by_unit import collectives_by_unit
from checks.probes.expect import assert_sequence
from checks.ranks.context import RankContext
from checks.violation import require_equal
from checks.workloads.gpt import POST_FORWARD, batch, fsdp1_gpt, padded_sizes


def _expected_backward(strategy_frees: bool, reduces: bool) -> list[str]:
    """The backward of the four trainable units by the prefetch model (BACKWARD_PRE, the default), with what each
    post-backward does right after its hook: free or keep the parameters, then reduce (or not)."""
    expected = []
    for line in backward_sequence(POST_FORWARD, "BACKWARD_PRE"):
        if line.startswith("prefetch"):
            continue
        expected.append(line)
        if line.startswith("post_backward"):
            unit = line.split()[1]
            expected.append(f"{'free' if strategy_frees else 'reshard'} {unit}")
            if reduces:
                expected.append(f"reduce_grad {unit}")
    return [*expected, f"final_callback {ROOT}"]


def full_shard_no_sync_frees_params(ctx: RankContext) -> dict[str, Any]:
    """Under FULL_SHARD inside ``no_sync`` every unit's post-backward frees its unsharded parameters at once (in
    the model's post-backward order) and reduces nothing; after backward no unit holds unsharded storage."""
    model = fsdp1_gpt(ctx)
    with model.no_sync():
        _, events = recorded_step(model, *batch(ctx))
    observed = backward_order(events)
    expected = _expected_backward(strategy_frees=True, reduces=False)
    assert_sequence(observed, expected, what="no_sync backward under FULL_SHARD", reason="no-sync-backward")
    held = held_bytes(model)
    require_equal(held, dict.fromkeys(held, 0), reason="held-after-backward", what="unsharded bytes after backward")
    return {"order": observed, "held": held}


def no_sync_reduces_nothing(ctx: RankContext) -> dict[str, Any]:
    """A FULL_SHARD step inside ``no_sync`` all-gathers exactly as a synced one (every unit in forward, every unit
    but the root again in backward, in the order the units run) and issues no reduce-scatter and no all-reduce;
    the synced step after it adds one reduce-scatter per unit, in post-backward order. Each collective is named
    by its unit (`collectives_by_unit`): the three blocks have one size, so sizes alone would not show the order."""
    model = fsdp1_gpt(ctx)
    sizes = padded_sizes(ctx.world_size, element_bytes=4)
    backward_units = [u for u in reversed(POST_FORWARD) if u != ROOT]  # the root was kept after forward (03)
    post_order = [line.split()[1] for line in backward_sequence(POST_FORWARD, None) if line.startswith("post")]
    gathers = {"forward": list(sizes), "backward": backward_units}
    observed: dict[str, dict[str, Any]] = {}
    for label, step in (("no_sync", 0), ("sync", 1)):
        if label == "no_sync":
            with model.no_sync():
                comm, events = recorded_step(model, *batch(ctx, step=step))
        else:
            comm, events = recorded_step(model, *batch(ctx, step=step))
        seen = {
            "forward_all_gather": collectives_by_unit(comm, events, "all_gather", in_backward=False),
            "backward_all_gather": collectives_by_unit(comm, events, "all_gather", in_backward=True),
            "reduce_scatter": collectives_by_unit(comm, events, "reduce_scatter"),
            "all_reduce": [c.numel for c in comm.select("all_reduce")],
        }
        want = {
            "forward_all_gather": [f"{u} {sizes[u]}" for u in gathers["forward"]],
            "backward_all_gather": [f"{u} {sizes[u]}" for u in gathers["backward"]],
            "reduce_scatter": [] if label == "no_sync" else [f"{u} {sizes[u]}" for u in post_order],
            "all_reduce": [],
        }
        for key, sizes_seen in seen.items():
            reason = f"{label}-{key}".replace("_", "-")  # e.g. no-sync-reduce-scatter
            assert_sequence(sizes_seen, want[key], what=f"{label} step: {key} sizes", reason=reason)
        observed[label] = {key: len(value) for key, value in seen.items()}
    return observed


# -- 2. SHARD_GRAD_OP inside no_sync -----------------------------------------------------------------------------
def shard_grad_op_no_sync_keeps_params(ctx: RankContext) -> dict[str, Any]:
    """Under SHARD_GRAD_OP inside ``no_sync`` each post-backward reshards without freeing and the final callback's
    catch-all finds nothing to do, so every unit still holds its unsharded storage after backward; the next,
    synced, step then all-gathers nothing, forward or backward, reduces once per unit and frees everything."""
    model = fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy.SHARD_GRAD_OP)
    full = {name: 4 * numel for name, numel in padded_sizes(ctx.world_size, element_bytes=4).items()}
    with model.no_sync():
        _, events = recorded_step(model, *batch(ctx, step=0))
    order = backward_order(events)
    expected = _expected_backward(strategy_frees=False, reduces=False)
    assert_sequence(order, expected, what="no_sync backward under SHARD_GRAD_OP", reason="no-sync-backward")
    held = held_bytes(model)
    require_equal(held, full, reason="held-after-backward", what="unsharded bytes after the no_sync backward")
    comm, events = recorded_step(model, *batch(ctx, step=1))
    gathers = comm.count("all_gather")
    require_equal(gathers, 0, reason="synced-step-all-gathers", what="all-gathers of the synced step after no_sync")
    unshards = sorted({e.detail for e in events.select("unshard")})
    require_equal(unshards, ["no all-gather"], reason="synced-step-all-gathers", what="the synced step's unshards")
    reduce_scatters = comm.count("reduce_scatter")
    require_equal(reduce_scatters, len(full), reason="synced-step-reductions", what="reduce-scatters of that step")
    after = held_bytes(model)
    require_equal(after, dict.fromkeys(after, 0), reason="held-after-synced-step", what="bytes after the synced step")
    return {"order": order, "held": held, "synced_all_gathers": gathers, "synced_reduce_scatters": reduce_scatters}
