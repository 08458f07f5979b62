"""Guide 13's DDP against one process: the seeds' 1e-5 on logits, and how it depends on the logits' scale."""

from __future__ import annotations

from typing import Any

import torch

from checks.ranks.context import RankContext
from checks.violation import require
from checks.workloads.data_parallel import (
    LR,
    gpt_replica,
)
from checks.workloads.gpt import batch
from checks.workloads.toy import wrap_ddp
from mini_gpt import GPT, preset
from mini_gpt.train import make_optimizer


# -- DDP against one process: the seeds' 1e-5 on logits, and the logit scale ------------------------------------------
def _scaled_gpt(ctx: RankContext, scale: float) -> GPT:
    """mini_gpt tiny with its tied embedding / head matrix multiplied by ``scale``: the logits scale with it."""
    model = gpt_replica(ctx)
    with torch.no_grad():
        model.tok_emb.weight.mul_(scale)
    return model


def ddp_vs_single_logits(ctx: RankContext, *, scales: list[float], tolerance: float, holds_up_to: float,
                         relative_bound: float, steps: int = 5) -> dict[str, Any]:  # fmt: skip
    """For each logit scale: one process trains on the global batch, DDP on each rank's share of it, from the same
    weights, ``steps`` AdamW steps; then both compute logits on an unseen batch. The largest difference stays
    within ``tolerance`` for every scale up to ``holds_up_to`` and exceeds it above; relative to the largest logit
    it stays within ``relative_bound`` at every scale."""
    from mini_gpt import BatchSampler, corpus_tokens

    sampler = BatchSampler(corpus_tokens(), preset("tiny").block_size, 8)
    probe = sampler.global_batch(steps)[0].to(ctx.device)
    rows: list[dict[str, float]] = []
    for scale in scales:
        single, ddp = _scaled_gpt(ctx, scale), wrap_ddp(_scaled_gpt(ctx, scale), ctx)
        optims = make_optimizer(single, LR), make_optimizer(ddp, LR)
        with torch.no_grad():
            start = single(probe)[0].abs().max().item()
        for step in range(steps):
            for model, optim, (x, y) in zip((single, ddp), optims, (sampler.global_batch(step), batch(ctx, step)),
                                            strict=True):  # fmt: skip
                _, loss = model(x.to(ctx.device), y.to(ctx.device))
                loss.backward()
                optim.step()
                optim.zero_grad(set_to_none=True)
        with torch.no_grad():
            a, b = single(probe)[0], ddp.module(probe)[0]
        drift = (a - b).abs().max().item()
        rows.append({"scale": scale, "max_logit_at_init": start, "max_logit": a.abs().max().item(), "drift": drift,
                     "relative": drift / a.abs().max().item()})  # fmt: skip
    for row in rows:
        if row["scale"] <= holds_up_to:
            require(row["drift"] <= tolerance, "drift-beyond-tolerance", f"scale {row['scale']}: logits drift "
                    f"{row['drift']} > {tolerance}", scale=row["scale"], observed=row["drift"],
                    bound=tolerance)  # fmt: skip
        else:
            require(row["drift"] > tolerance, "drift-within-tolerance", f"scale {row['scale']}: logits drift only "
                    f"{row['drift']} <= {tolerance}", scale=row["scale"], observed=row["drift"],
                    bound=tolerance)  # fmt: skip
    worst = max(r["relative"] for r in rows)
    require(worst <= relative_bound, "relative-drift", f"drift / max |logit| reaches {worst} > {relative_bound}",
            observed=worst, bound=relative_bound)  # fmt: skip
    return {"rows": rows, "worst_relative": worst, "breaks_at": min((r["scale"] for r in rows
            if r["drift"] > tolerance), default=None)}  # fmt: skip
