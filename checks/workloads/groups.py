"""Process groups the checks build beside the world: every rank must create every group, in one order."""

from __future__ import annotations

import torch.distributed as dist

from checks.ranks.context import RankContext


def one_rank_group(ctx: RankContext) -> dist.ProcessGroup:
    """A process group of this rank alone."""
    groups = [dist.new_group([rank]) for rank in range(ctx.world_size)]
    return groups[ctx.rank]
