"""T5's shape in three blocks: the first computes a bias from a table of its own, every block adds it to its
input and returns it beside its output, so the blocks after the first return one of their inputs unchanged (T5's
``position_bias``). Guide 13's pass-through claim and ``inspect``'s tests run it."""

from __future__ import annotations

import torch
from torch import nn

WIDTH = 8
BLOCKS = ("blocks.0", "blocks.1", "blocks.2")


class BiasBlock(nn.Module):
    def __init__(self, has_bias: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.bias_table = nn.Parameter(torch.randn(WIDTH)) if has_bias else None

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if bias is None:
            bias = self.bias_table * 0.5
        return torch.tanh(self.fc(x) + bias), bias


class PassThrough(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(BiasBlock(i == 0) for i in range(len(BLOCKS)))
        self.head = nn.Linear(WIDTH, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None
        for block in self.blocks:
            x, bias = block(x, bias)
        return self.head(x)


def pass_through() -> nn.Module:
    return PassThrough()


def batch() -> torch.Tensor:
    return torch.randn(2, WIDTH)
