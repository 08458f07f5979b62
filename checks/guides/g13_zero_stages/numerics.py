"""Guide 13's numerics: every implementation against DDP, step by step, bitwise at N=2 and within the guide's
bound at N=4, each reduced gradient a sum of the ranks' local ones."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from checks.models.zero_memory import (
    IMPLEMENTATIONS,
)
from checks.numerics import pairwise_sums
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.data_parallel import (
    Trained,
    build,
    gpt_replica,
)
from checks.workloads.gpt import batch


# -- numerics: every implementation against DDP ---------------------------------------------------------------------
def _trajectory(trained: Trained, ctx: RankContext, steps: int) -> dict[str, Any]:
    """Train ``steps`` steps; the losses, the whole parameters after each step, and the reduced gradients of the
    first backward."""
    losses, params, first = [], [], {}
    for step in range(steps):
        _, loss = trained.forward(*batch(ctx, step=step))
        loss.backward()
        if step == 0:
            first = {n: g.flatten().cpu() for n, g in trained.grads_fn().items()}
        trained.step_fn()
        trained.zero_grad_fn()
        losses.append(loss.detach().clone())
        params.append(trained.params_fn())
    return {"losses": losses, "params": params, "grads": first}


def _local_grads(ctx: RankContext, names: list[str]) -> list[torch.Tensor]:
    """Every rank's local gradient of step 1 (an unwrapped replica on the rank's own batch), flattened in
    ``names`` order, gathered."""
    replica = gpt_replica(ctx)
    _, loss = replica(*batch(ctx, step=0))
    loss.backward()
    grads = dict(replica.named_parameters())
    local = torch.cat([grads[n].grad.detach().flatten().cpu() for n in names])
    everyone = [torch.empty_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(everyone, local)
    return everyone


def against_ddp(ctx: RankContext, impls: list[str] | None = None, steps: int = 5,
                bound: float | None = None) -> dict[str, Any]:  # fmt: skip
    """Each implementation and DDP train from the same weights on the same batches. ``bound=None``: the losses
    and every parameter after every step equal DDP's, bit for bit. Otherwise every step-1 reduced gradient times
    N is one of the fp32 pairwise sums of the N local gradients (a summation order, nothing else), and losses and
    parameters stay within ``bound`` of DDP's."""
    impls = [i for i in impls or IMPLEMENTATIONS if i != "ddp"]
    reference = _trajectory(build("ddp", ctx), ctx, steps)
    names = list(reference["params"][0])
    sums = None
    if bound is not None:
        n = ctx.world_size
        if n & (n - 1):
            raise ValueError(f"{n} ranks: multiplying the mean back by N is exact only for a power of two")
        sums = torch.stack(pairwise_sums(_local_grads(ctx, names)))
    report: dict[str, Any] = {}
    for impl in ["ddp", *impls]:
        run = reference if impl == "ddp" else _trajectory(build(impl, ctx), ctx, steps)
        require_equal(sorted(run["params"][0]), sorted(names), reason="parameter-names", what=f"{impl}: names")
        param_diff = [max(float((p[k] - q[k]).abs().max()) for k in names)
                      for p, q in zip(run["params"], reference["params"], strict=True)]  # fmt: skip
        loss_diff = [abs(float(a) - float(b)) for a, b in zip(run["losses"], reference["losses"], strict=True)]
        grads = torch.cat([run["grads"][k] for k in names])
        entry = {"param_diff": param_diff, "loss_diff": max(loss_diff)}
        if sums is not None:
            unexplained = int((~(sums == grads * ctx.world_size).any(dim=0)).sum())
            require(unexplained == 0, "not-a-summation-order", f"{impl}: {unexplained} step-1 gradient elements "
                    f"× {ctx.world_size} are no fp32 sum of the local gradients", impl=impl,
                    observed=unexplained)  # fmt: skip
            ddp_grads = torch.cat([reference["grads"][k] for k in names])
            entry["grads_differing"] = int((grads != ddp_grads).sum())
        if bound is None:
            for step, (a, b) in enumerate(zip(run["losses"], reference["losses"], strict=True), start=1):
                require(torch.equal(a, b), "loss-differs", f"{impl}, step {step}: loss {float(a)} vs DDP's "
                        f"{float(b)}", impl=impl, step=step)  # fmt: skip
                differing = [k for k in names if not torch.equal(run["params"][step - 1][k],
                                                                 reference["params"][step - 1][k])]  # fmt: skip
                require(not differing, "differs-from-ddp", f"{impl}, after step {step}: {len(differing)} parameters "
                        f"differ from DDP's, by up to {param_diff[step - 1]}", impl=impl, step=step,
                        differing=differing, max_abs_diff=param_diff[step - 1])  # fmt: skip
        else:
            for step, diff in enumerate(param_diff, start=1):
                require(diff <= bound, "beyond-bound", f"{impl}, after step {step}: max |param - DDP's| = {diff} > "
                        f"{bound}", impl=impl, step=step, observed=diff, bound=bound)  # fmt: skip
            require(max(loss_diff) <= bound, "loss-beyond-bound", f"{impl}: max |loss - DDP's| = {max(loss_diff)}",
                    impl=impl, observed=max(loss_diff), bound=bound)  # fmt: skip
        report[impl] = entry
    worst = max(max(e["param_diff"]) for e in report.values())
    return {
        "verdict": "bitwise equal"
        if worst == 0 and all(e["loss_diff"] == 0 for e in report.values())
        else "not bitwise equal",
        "worst_param_diff": worst,
        "by_impl": report,
        "losses": [float(v) for v in reference["losses"]],
    }
