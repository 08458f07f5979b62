"""replicas-stay-identical and -at-4: the seeds' "they stay identical": after every AdamW step every rank's
parameters are bitwise rank 0's."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from checks.guides.g19_ddp_buckets.ddp_runs import LR, ddp_of, loss_of, parameters_flat
from checks.ranks.context import RankContext
from checks.violation import require


def replicas_identical(ctx: RankContext, steps: int = 5) -> dict[str, Any]:
    """mini_gpt tiny under DDP and AdamW: after every step every rank's parameters are bitwise rank 0's."""
    ddp = ddp_of(ctx, "tiny")
    optim = torch.optim.AdamW(ddp.parameters(), lr=LR)
    for step in range(steps):
        loss_of(ddp, ctx, "tiny", step).backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        mine = parameters_flat(ddp.module)
        everyone = [torch.empty_like(mine) for _ in range(ctx.world_size)]
        dist.all_gather(everyone, mine)
        differing = {r: int((everyone[r] != everyone[0]).sum()) for r in range(1, ctx.world_size)}
        require(not any(differing.values()), "replicas-differ", f"after step {step + 1} ranks differ from rank 0 in "
                f"{differing} elements", step=step + 1, differing=differing)  # fmt: skip
    return {"steps": steps, "elements": int(mine.numel())}
