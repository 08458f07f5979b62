"""Guide 09 against DDP: NO_SHARD and DistributedDataParallel trained side by side from the same weights on the same
batches, bit for bit on two ranks, within a bound (and a summation order of the local gradients) on four."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from checks.guides.g09_no_shard_is_ddp.replicas import LR, build_replica, no_shard_gpt
from checks.naming import clean
from checks.numerics import pairwise_sums
from checks.probes.comm import record_comm
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.gpt import batch, unit_numels
from checks.workloads.toy import wrap_ddp
from mini_gpt.train import make_optimizer


def _train_side_by_side(ctx: RankContext, steps: int, lr: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Train the NO_SHARD model and a DDP model from the same weights on the same per-rank batches. Per step: the
    two losses and which parameters differ (by name, bitwise) after the optimizer step. Also both models'
    gradients after the first backward, flattened in the replica's parameter order."""
    fsdp = no_shard_gpt(ctx)
    ddp = wrap_ddp(build_replica(ctx), ctx)
    start = {name: p.detach().clone() for name, p in ddp.module.named_parameters()}
    optims = make_optimizer(fsdp, lr), make_optimizer(ddp, lr)
    records: list[dict[str, Any]] = []
    first: dict[str, Any] = {}
    for step in range(steps):
        x, y = batch(ctx, step=step)
        losses = []
        for model in (fsdp, ddp):
            with record_comm() as comm:
                _, loss = model(x, y)
                loss.backward()
            losses.append(loss.detach())
        ddp_all_reduces = [c.numel for c in comm.select("all_reduce")]
        ours = {clean(name): p for name, p in fsdp.named_parameters()}
        theirs = dict(ddp.module.named_parameters())
        require_equal(sorted(ours), sorted(theirs), reason="parameter-names", what="parameter names")
        if step == 0:
            first = {
                "names": list(theirs),
                "fsdp": torch.cat([ours[n].grad.detach().flatten().cpu() for n in theirs]),
                "ddp": torch.cat([theirs[n].grad.detach().flatten().cpu() for n in theirs]),
            }
        for optim in optims:
            optim.step()
            optim.zero_grad(set_to_none=True)
        differing = [name for name in theirs if not torch.equal(ours[name], theirs[name])]
        gap = torch.cat([(ours[n] - theirs[n]).detach().abs().flatten().cpu() for n in theirs])
        records.append(
            {
                "step": step + 1,
                "loss": [float(v) for v in losses],
                "loss_equal": bool(torch.equal(*losses)),
                "ddp_all_reduces": ddp_all_reduces,
                "differing": differing,
                "max_abs_diff": float(gap.max()),
                "argmax": int(gap.argmax()),  # in the replica's parameter order, like first["fsdp"]
                "moved": max(float((theirs[n].detach() - start[n]).abs().max()) for n in theirs),
            }
        )
    return records, first


def matches_ddp_bitwise(ctx: RankContext, steps: int = 5, lr: float = LR) -> dict[str, Any]:
    """NO_SHARD and DDP give the same losses and the same parameters, bit for bit, after every step."""
    records, _ = _train_side_by_side(ctx, steps, lr)
    whole = sum(sum(numels) for numels in unit_numels().values())  # every parameter once, no alignment gaps
    for record in records:
        step = record["step"]
        require_equal(record["ddp_all_reduces"], [whole], reason="ddp-not-one-bucket",
                      what=f"step {step}: DDP's all-reduce lengths", step=step)  # fmt: skip
        require(record["loss_equal"], "loss-differs", f"step {step}: losses {record['loss']} (NO_SHARD, DDP)",
                step=step, observed=record["loss"])  # fmt: skip
        differing = record["differing"]
        message = f"after step {step}, {len(differing)} parameters differ from DDP's, by up to {record['max_abs_diff']}"
        require(not differing, "differs-from-ddp", message, step=step, differing=differing,
                max_abs_diff=record["max_abs_diff"])  # fmt: skip
    return {
        "steps": steps,
        "bitwise": True,
        "differing": [len(r["differing"]) for r in records],
        "ddp_all_reduces": records[0]["ddp_all_reduces"],
        "moved": records[-1]["moved"],
    }


def within_bound_of_ddp(ctx: RankContext, bound: float, steps: int = 5, lr: float = LR) -> dict[str, Any]:
    """On more than two ranks the two all-reduces may add the ranks' gradients in different orders. After the first
    backward, each side's gradient times N must be one of the fp32 pairwise sums of the ranks' local gradients
    (the replica's, gathered); over the run, parameters and losses must stay within ``bound`` of DDP's."""
    n = ctx.world_size
    if n & (n - 1):
        raise ValueError(f"{n} ranks: multiplying the mean back by N is exact only for a power of two")
    records, first = _train_side_by_side(ctx, steps, lr)
    replica = build_replica(ctx)
    _, loss = replica(*batch(ctx, step=0))
    loss.backward()
    params = dict(replica.named_parameters())
    local = torch.cat([params[name].grad.detach().flatten().cpu() for name in first["names"]])
    everyone = [torch.empty_like(local) for _ in range(n)]
    dist.all_gather(everyone, local)
    sums = torch.stack(pairwise_sums(everyone))
    for side in ("fsdp", "ddp"):
        explained = (sums == first[side] * n).any(dim=0)
        unexplained = int((~explained).sum())
        message = f"{side}: {unexplained} gradient elements × {n} are no fp32 sum of the {n} local gradients"
        require(unexplained == 0, "not-a-summation-order", message, side=side, observed=unexplained)
    grad_diff = (first["fsdp"] - first["ddp"]).abs()
    larger = torch.maximum(first["fsdp"].abs(), first["ddp"].abs())
    relative = grad_diff[grad_diff > 0] / larger[grad_diff > 0]
    at = records[0]["argmax"]  # the element that moved apart most in step 1, and its gradient
    worst = [r["max_abs_diff"] for r in records]
    loss_diff = max(abs(a - b) for a, b in (r["loss"] for r in records))
    for record in records:
        message = f"after step {record['step']}: max |param - DDP's| = {record['max_abs_diff']} > {bound}"
        require(record["max_abs_diff"] <= bound, "beyond-bound", message, step=record["step"],
                observed=record["max_abs_diff"], bound=bound)  # fmt: skip
    require(loss_diff <= bound, "loss-beyond-bound", f"max |loss - DDP's| = {loss_diff} > {bound}",
            observed=loss_diff, bound=bound)  # fmt: skip
    bitwise = not any(worst) and loss_diff == 0
    return {
        "verdict": "bitwise equal" if bitwise else "not bitwise equal",
        "grad_elements": local.numel(),
        "grad_elements_differing": int((grad_diff > 0).sum()),
        "grad_max_abs_diff": float(grad_diff.max()),
        "grad_max_rel_diff": float(relative.max()) if relative.numel() else 0.0,
        "step_1_worst": {"param_diff": worst[0], "grad": float(first["ddp"][at]), "grad_diff": float(grad_diff[at])},
        "max_abs_diff": worst,
        "loss_max_abs_diff": loss_diff,
        "moved": records[-1]["moved"],
    }
