"""A model whose ranks make their gradients ready in different orders (guide 19): what shows that DDP's rebuilt
buckets are rank 0's layout, broadcast, and not each rank's own."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class RankOrderedBranches(nn.Module):
    """Two Linear(8, 8) branches summed. Rank 0 runs ``a`` first, every other rank ``b``: autograd runs the later
    branch's backward first, so rank 0's gradients become ready in another order than the other ranks'."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second = (self.a, self.b) if dist.get_rank() == 0 else (self.b, self.a)
        done = first(x).sum()
        return done + second(x).sum()
