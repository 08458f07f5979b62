"""A unit used twice in one forward: one post-forward entry and one all-gather per use, one reduce-scatter per
unit, and the sharded gradients DDP's slices."""

from __future__ import annotations

from typing import Any

from torch import nn

from checks.guides.g18_fsdp2_reshard_and_gradients.reductions import compare_to_slices, grads_by_name, rank_slices
from checks.guides.g18_fsdp2_reshard_and_gradients.units import padded
from checks.models import fsdp2_reshard
from checks.naming import ROOT, unit_name
from checks.probes.comm import record_comm
from checks.ranks.context import RankContext
from checks.violation import require_equal
from checks.workloads.gpt import batch
from checks.workloads.toy import wrap_ddp
from mini_gpt import preset

TWICE = (0, 1, 1, 2)  # blocks.1 runs twice


def _twice_models(ctx: RankContext, setting: bool | None) -> tuple[nn.Module, nn.Module]:
    """mini_gpt whose forward runs blocks 0, 1, 1, 2 (`ReorderableGPT`, guide 04), under FSDP2 and under DDP."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from checks.workloads.reorderable import ReorderableGPT

    models = []
    for _ in range(2):
        model = ReorderableGPT(preset("tiny"), seed=0).to(ctx.device)
        model.blocks.order = list(TWICE)
        models.append(model)
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    kwargs = {} if setting is None else {"reshard_after_forward": setting}
    for block in models[0].blocks._modules.values():
        fully_shard(block, mesh=mesh, **kwargs)
    return fully_shard(models[0], mesh=mesh, **kwargs), wrap_ddp(models[1], ctx)


def unit_used_twice(ctx: RankContext) -> dict[str, Any]:
    """blocks.1 run twice in forward, under True and None: the post-forward order holds it twice; forward
    all-gathers every use, backward every use again (blocks.1's first post-backward, which finds no gradient
    yet, reshards it without reducing), and each unit is reduce-scattered once, as `repeated_use_step` says;
    the sharded gradients are bitwise DDP's slices."""
    from checks.probes.events import record_events

    uses = [f"blocks.{i}" for i in TWICE]
    sizes = padded(ctx.world_size)
    out: dict[str, Any] = {}
    for label, setting in (("True", True), ("None", None)):
        fsdp, ddp = _twice_models(ctx, setting)
        x, y = batch(ctx)
        with record_events(fsdp) as events:
            with record_comm() as forward:
                loss = fsdp(x, y)[1]
            order = [unit_name(g._module_fqn) for g in fsdp._get_fsdp_state()._comm_ctx.post_forward_order]
            with record_comm() as backward:
                loss.backward()
        ddp(x, y)[1].backward()
        want = fsdp2_reshard.repeated_use_step(uses, ROOT, setting)
        where = {"setting": label}
        require_equal(order, [*uses, ROOT], reason="post-forward-order", what=f"{label}: post-forward order", **where)
        observed = {
            "forward": [c.numel for c in forward.select("all_gather")],
            "backward": [c.numel for c in backward.select("all_gather")],
            "reduce_scatter": [c.numel for c in backward.select("reduce_scatter")],
        }
        expected = {phase: [sizes[u] for u in units] for phase, units in want.items()}
        require_equal(observed, expected, reason="collectives-differ", what=f"{label}: collectives (elements)",
                      **where)  # fmt: skip
        hooks = [e.describe() for e in events if e.kind in ("post_backward", "reduce_grad") and e.unit == "blocks.1"]
        require_equal(hooks, ["post_backward blocks.1", "post_backward blocks.1", "reduce_grad blocks.1"],
                      reason="hooks-differ", what=f"{label}: blocks.1's post-backwards", **where)  # fmt: skip
        result = compare_to_slices(fsdp, rank_slices(grads_by_name(ddp), fsdp, ctx), ctx, f"used twice, {label}")
        out[label] = {"post_forward": order, **{k: len(v) for k, v in observed.items()}, **result}
    return out
