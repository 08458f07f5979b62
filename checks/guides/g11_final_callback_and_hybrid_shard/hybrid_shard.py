"""Guide 11's HYBRID_SHARD: the default groups (on CPU one-rank shard groups, clamped to NO_SHARD, whose replicas
never sync: pytorch#154888) and a 2 x 2 mesh of shard and replicate groups, against DDP."""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy

from checks.models.flat_param import layout
from checks.numerics import pairwise_sums
from checks.probes.comm import record_comm
from checks.probes.expect import assert_sequence
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.gpt import batch, ddp_gpt, fsdp1_gpt, grad_shards, post_backward_order, unit_numels, units
from checks.workloads.groups import one_rank_group
from mini_gpt import GPT, preset
from mini_gpt.model import Block
from mini_gpt.train import make_optimizer

LR = 1e-3


def _hybrid_gpt(ctx: RankContext, groups: str) -> FSDP:
    """mini_gpt tiny under HYBRID_SHARD. ``default``: FSDP builds the groups (it requires an auto-wrap policy for
    that); ``shard-over-world``: the world as the shard group and a one-rank replicate group."""
    if groups == "default":
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the clamp's warning (guide 09)
            model = GPT(preset("tiny"), seed=0).to(ctx.device)
            return FSDP(model, device_id=ctx.device, use_orig_params=True, auto_wrap_policy=ModuleWrapPolicy({Block}),
                        sharding_strategy=ShardingStrategy.HYBRID_SHARD)  # fmt: skip
    if groups == "shard-over-world":
        alone = one_rank_group(ctx)
        return fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy.HYBRID_SHARD, process_group=(dist.group.WORLD, alone))
    raise ValueError(f"unknown groups {groups!r}")


def _ddp_named(ddp: nn.Module, attribute: str) -> dict[str, torch.Tensor]:
    return {name.removeprefix("module."): getattr(p, attribute) for name, p in ddp.named_parameters()}


def _shard_of(unit: FSDP) -> tuple[int, int]:
    """(ranks, rank) the unit shards over: its shard group, or one rank under NO_SHARD (the whole gradient)."""
    if unit._handle.uses_sharded_strategy:
        return unit.process_group.size(), unit.process_group.rank()
    return 1, 0


def hybrid_shard_averages_over_replicas(ctx: RankContext, groups: str = "default") -> dict[str, Any]:
    """What a user expects of HYBRID_SHARD with the default groups: after one backward, every replica holds the
    same gradient, and it is DDP's (bitwise: at two ranks every correct mean is a/2 + b/2 in some order, exact).
    With ``groups="default"`` the groups must first be what the source builds: a shard group of
    `device_count()` ranks (1 on CPU) and a replicate group of the rest."""
    model = _hybrid_gpt(ctx, groups)
    shard_pg, replicate_pg = model.process_group, model._inter_node_pg
    sizes = {"shard": shard_pg.size(), "replicate": replicate_pg.size(),
             "device_count": model._device_handle.device_count()}  # fmt: skip
    if groups == "default":
        want = {"shard": sizes["device_count"], "replicate": ctx.world_size // sizes["device_count"],
                "device_count": 1 if ctx.device.type == "cpu" else sizes["device_count"]}  # fmt: skip
        require_equal(sizes, want, reason="default-groups", what="(shard, replicate) group sizes and device count")
    strategies = sorted({u._handle._sharding_strategy.name for u in units(model).values()})
    x, y = batch(ctx)
    with record_comm() as comm:
        _, loss = model(x, y)
        loss.backward()
    ddp = ddp_gpt(ctx)
    ddp(x, y)[1].backward()
    reference = _ddp_named(ddp, "grad")
    spans = sorted({(c.op, c.group_size) for c in comm if c.in_backward})
    for name, unit in units(model).items():
        grad = unit._handle.flat_param.grad.detach()
        peers = [torch.empty_like(grad) for _ in range(replicate_pg.size())]
        dist.all_gather(peers, grad, group=replicate_pg)
        differing = [dist.get_global_rank(replicate_pg, i) for i, g in enumerate(peers) if not torch.equal(g, grad)]
        worst = max(float((g - grad).abs().max()) for g in peers)
        require(not differing, "replicas-not-synced", f"{name}: rank {ctx.rank}'s gradient differs from replicas "
                f"{differing} by up to {worst:.3g}", unit=name, differing=differing, max_abs_diff=worst,
                strategies=strategies, spans=spans, sizes=sizes)  # fmt: skip
        world, rank = _shard_of(unit)
        expected = grad_shards(reference, world, rank)[name]
        require(torch.equal(grad, expected), "not-ddp-gradient", f"{name}: synced, but not DDP's gradient (max |Δ| "
                f"{float((grad - expected).abs().max()):.3g})", unit=name, strategies=strategies)  # fmt: skip
    return {"sizes": sizes, "strategies": strategies, "spans": spans}


def _two_by_two(ctx: RankContext) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """Shard groups {0,1},{2,3}; replicate groups {0,2},{1,3} (every rank creates every group, in one order)."""
    require_equal(ctx.world_size, 4, reason="needs-four-ranks", what="world size")
    shard = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    replicate = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    return shard[ctx.rank // 2], replicate[ctx.rank % 2]


def _flat(model: FSDP, what: str) -> dict[str, torch.Tensor]:
    out = {}
    for name, unit in units(model).items():
        flat = unit._handle.flat_param
        out[name] = (flat.grad if what == "grad" else flat).detach().clone().cpu()
    return out


def _worst(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> tuple[float, int]:
    diffs = [(got[n] - want[n]).abs() for n in want]
    return max(float(d.max()) for d in diffs), sum(int((d > 0).sum()) for d in diffs)


def hybrid_2x2_matches_ddp(ctx: RankContext, bound: float, grad_bound: float, steps: int = 3) -> dict[str, Any]:
    """HYBRID_SHARD over shard groups of 2 and replicate groups of 2 on four ranks. Each backward issues, per unit
    in post-backward order, a reduce-scatter of the unit's padded size (layout model, two shards) over the shard
    group, then an all-reduce of one shard over the replicate group. The first gradients are a summation order
    of the four local gradients; over ``steps`` AdamW steps gradients stay within ``grad_bound`` of DDP's (laid out
    as this rank's shard of two), parameters and losses within ``bound``."""
    shard_pg, replicate_pg = _two_by_two(ctx)
    model = fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy.HYBRID_SHARD, process_group=(shard_pg, replicate_pg))
    ddp = ddp_gpt(ctx)
    optims = make_optimizer(model, LR), make_optimizer(ddp, LR)
    shard_ranks = tuple(sorted(dist.get_process_group_ranks(shard_pg)))
    replicate_ranks = tuple(sorted(dist.get_process_group_ranks(replicate_pg)))
    layouts = {name: layout(numels, 4, shard_pg.size()) for name, numels in unit_numels().items()}
    expected_comm = []
    for name in post_backward_order():
        expected_comm.append(f"reduce_scatter {layouts[name].padded_numel} over {shard_ranks}")
        expected_comm.append(f"all_reduce {layouts[name].shard_numel} over {replicate_ranks}")
    grads, params, loss_gaps, counts = [], [], [], []
    start, scale = _flat(model, "param"), 0.0
    for step in range(steps):
        x, y = batch(ctx, step=step)
        with record_comm() as comm:
            _, loss = model(x, y)
            loss.backward()
        _, ref = ddp(x, y)
        ref.backward()
        reduced = [c for c in comm if c.op in ("reduce_scatter", "all_reduce")]
        reductions = [f"{c.op} {c.numel} over {c.group_ranks}" for c in reduced]
        assert_sequence(reductions, expected_comm, what=f"step {step + 1}: gradient reductions", reason="reductions")
        callers = sorted({c.caller.split(":")[1] for c in comm if c.op != "all_gather"})
        require_equal(callers, ["_reduce_grad"], reason="reduction-caller", what=f"step {step + 1}: callers")
        gathers = sorted({c.group_ranks for c in comm if c.op == "all_gather"})
        require_equal(gathers, [shard_ranks], reason="gather-group", what=f"step {step + 1}: all-gather groups")
        shard_rank = shard_pg.rank()
        want_grads = grad_shards(_ddp_named(ddp, "grad"), shard_pg.size(), shard_rank)
        got_grads = _flat(model, "grad")
        if step == 0:
            _summation_order(ctx, got_grads, (x, y), (shard_pg.size(), shard_rank))
            scale = max(float(g.abs().max()) for g in want_grads.values())
        grads.append(_worst(got_grads, want_grads))
        loss_gaps.append(abs(float(loss.detach()) - float(ref.detach())))
        counts.append(len(reductions))
        for optim in optims:
            optim.step()
            optim.zero_grad(set_to_none=True)
        params.append(_worst(_flat(model, "param"), grad_shards(_ddp_named(ddp, "data"), shard_pg.size(),
                                                                    shard_rank)))  # fmt: skip
    # Every rank's worst, so each rank judges (and reports) the same numbers.
    moved = max(float((p - start[n]).abs().max()) for n, p in _flat(model, "param").items())
    everyone = ctx.gather({"grads": grads, "params": params, "loss": max(loss_gaps), "scale": scale, "moved": moved})
    worst_grad = [max(r["grads"][i][0] for r in everyone) for i in range(steps)]
    worst_param = [max(r["params"][i][0] for r in everyone) for i in range(steps)]
    for step, (g, p) in enumerate(zip(worst_grad, worst_param, strict=True), start=1):
        require(g <= grad_bound, "grad-beyond-bound", f"step {step}: max |grad - DDP's| = {g:.3g} > {grad_bound}",
                step=step, observed=g, bound=grad_bound)  # fmt: skip
        require(p <= bound, "param-beyond-bound", f"after step {step}: max |param - DDP's| = {p:.3g} > {bound}",
                step=step, observed=p, bound=bound)  # fmt: skip
    loss_gap = max(r["loss"] for r in everyone)
    require(loss_gap <= bound, "loss-beyond-bound", f"max |loss - DDP's| = {loss_gap:.3g} > {bound}",
            observed=loss_gap, bound=bound)  # fmt: skip
    return {
        "reductions_per_backward": counts[0],
        "grad_max_abs_diff": worst_grad,
        # Ranks 0 and 1 hold one copy of every element between them (2 and 3 hold the replica's).
        "grad_elements_differing": [sum(r["grads"][i][1] for r in everyone[:2]) for i in range(steps)],
        "param_max_abs_diff": worst_param,
        "loss_max_abs_diff": loss_gap,
        "step_1_max_abs_grad": max(r["scale"] for r in everyone),
        "moved": max(r["moved"] for r in everyone),
    }


def _summation_order(
    ctx: RankContext, got: dict[str, torch.Tensor], data: tuple[Any, Any], shard: tuple[int, int]
) -> None:
    """Every element of this rank's first sharded gradient, times N, is an fp32 pairwise sum of the N ranks'
    local gradients (the unwrapped replica's, gathered): a summation order, nothing else."""
    replica = GPT(preset("tiny"), seed=0).to(ctx.device)
    world, rank = shard
    replica(*data)[1].backward()
    named = [(n, p.grad.detach().cpu()) for n, p in replica.named_parameters()]
    whole = torch.cat([g.flatten() for _, g in named])
    gathered = [torch.empty_like(whole) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, whole)  # whole local gradients: the ranks hold different shard indices
    everyone = []
    for flat in gathered:
        grads, start = {}, 0
        for n, g in named:
            grads[n] = flat[start : start + g.numel()].view_as(g)
            start += g.numel()
        shards = grad_shards(grads, world, rank)  # this rank's shard of that rank's local gradient
        everyone.append(torch.cat([shards[n] for n in got]))
    sums = torch.stack(pairwise_sums(everyone))
    observed = torch.cat([got[n] for n in got]) * ctx.world_size
    unexplained = int((~(sums == observed).any(dim=0)).sum())
    require(unexplained == 0, "not-a-summation-order", f"{unexplained} gradient elements × {ctx.world_size} are no "
            f"fp32 sum of the local gradients", observed=unexplained)  # fmt: skip
