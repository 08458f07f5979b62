"""Models and batches for tests/study/test_inspect.py: the bad inputs ``inspect`` must refuse, and a model whose
forward runs its units out of registration order (a true difference from the assumed post-forward order)."""

from __future__ import annotations

import torch
from torch import nn


def raises() -> nn.Module:
    raise RuntimeError("the config file is missing")


def no_parameters() -> nn.Module:
    return nn.Sequential(nn.ReLU(), nn.Tanh())


def not_a_module() -> int:
    return 3


def three_linears() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 2))


def wrong_width_batch() -> torch.Tensor:
    return torch.randn(2, 5)  # the first Linear takes 4 features


def batch() -> torch.Tensor:
    return torch.randn(2, 4)


class Reversed(nn.Module):
    """Three Linear(4, 4) children that forward runs last to first."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in reversed(self.layers):
            x = layer(x)
        return x


def huge() -> nn.Module:
    return nn.Linear(8000, 8000)  # 64,008,000 parameters: over the run limit, fine on meta


def normed() -> nn.Module:
    """Two Linear layers around a BatchNorm1d(6): buffers of 6 + 6 float32 elements and 1 int64 (its
    ``num_batches_tracked``), which DDP broadcasts before every forward."""
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 2))


def nested() -> nn.Module:
    """A Sequential inside the root Sequential: ``--wrap Sequential,Linear`` makes units inside units."""
    return nn.Sequential(nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 6)), nn.Linear(6, 2))


class PairBlock(nn.Module):
    """A Linear(4, 4) that returns a pair, as Hugging Face blocks return tuples: its output and a copy cut off from
    the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.linear(x)
        return y, y.detach()


class Pairs(nn.Module):
    """Two `PairBlock` children and no parameter of its own: a root the reference ZeRO-3 keeps no group for."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(PairBlock() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x, _ = block(x)
        return x
