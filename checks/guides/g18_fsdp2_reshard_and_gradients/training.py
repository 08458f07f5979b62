"""Training: five AdamW steps under FSDP2, FSDP1 and DDP, every loss and parameter bitwise the same."""

from __future__ import annotations

from typing import Any

import torch

from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.gpt import batch, ddp_gpt, fsdp1_gpt, fsdp2_gpt


def five_adamw_steps(ctx: RankContext, steps: int = 5) -> dict[str, Any]:
    """``steps`` AdamW steps of mini_gpt tiny under FSDP2, FSDP1 FULL_SHARD and DDP, each on the same per-rank
    batches: every loss, and every parameter after the last step, bitwise the same in all three."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    models = {"fsdp2": fsdp2_gpt(ctx), "fsdp1": fsdp1_gpt(ctx), "ddp": ddp_gpt(ctx)}
    optims = {k: torch.optim.AdamW(m.parameters(), lr=1e-2) for k, m in models.items()}
    losses: dict[str, list[float]] = {k: [] for k in models}
    for step in range(steps):
        x, y = batch(ctx, step=step)
        for key, model in models.items():
            loss = model(x, y)[1]
            loss.backward()
            optims[key].step()
            optims[key].zero_grad()
            losses[key].append(loss.item())
    for key in ("fsdp2", "fsdp1"):
        require_equal(losses[key], losses["ddp"], reason="losses-differ", what=f"{key} losses against DDP's", impl=key)
    full = {"ddp": {n.removeprefix("module."): p.detach().clone() for n, p in models["ddp"].named_parameters()},
            "fsdp2": {n: p.full_tensor().detach() for n, p in models["fsdp2"].named_parameters()}}  # fmt: skip
    with FSDP.summon_full_params(models["fsdp1"]):
        full["fsdp1"] = {n.replace("_fsdp_wrapped_module.", ""): p.detach().clone()
                         for n, p in models["fsdp1"].named_parameters()}  # fmt: skip
    for key in ("fsdp2", "fsdp1"):
        differs = [n for n, p in full["ddp"].items() if not torch.equal(full[key][n], p)]
        require(not differs, "parameters-differ", f"{key}: parameters after {steps} steps differ from DDP's: "
                f"{differs}", impl=key, differs=differs)  # fmt: skip
    return {"losses": losses["ddp"], "parameters": len(full["ddp"])}
