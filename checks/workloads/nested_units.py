"""Units inside units: two ``Outer`` blocks, each holding two ``Inner`` layers and a projection of its own that runs
after them, then a head. ``ModuleWrapPolicy({Outer, Inner})`` makes every ``Outer`` a unit whose own flat
parameter is its projection, with two units nested in it. Guide 06's nested claim and ``inspect``'s tests run it."""

from __future__ import annotations

import torch
from torch import nn

from checks.naming import ROOT

WIDTH = 8
OUTERS = 2
# Post-forward order: each Outer's inner units end their forwards before it; the root last.
POST_FORWARD = (
    *(unit for i in range(OUTERS) for unit in (f"outers.{i}.inner.0", f"outers.{i}.inner.1", f"outers.{i}")),
    ROOT,
)
PARENTS = {f"outers.{i}.inner.{j}": f"outers.{i}" for i in range(OUTERS) for j in range(2)}


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.ModuleList(Inner() for _ in range(2))
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.inner:
            x = layer(x)
        return self.proj(x)


class ParentAndChildren(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.outers = nn.ModuleList(Outer() for _ in range(OUTERS))
        self.head = nn.Linear(WIDTH, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for outer in self.outers:
            x = outer(x)
        return self.head(x)


def parent_and_children() -> nn.Module:
    return ParentAndChildren()
