"""The trees guide 20 wraps: `Edge`, a small model built to hit the wrap code's edge cases (a tied weight, a
``ModuleList``, a forced leaf of the size policy, a BatchNorm mixed precision leaves alone), and `build` /
`step_loss` for it, mini_gpt tiny and torch's ``nn.Transformer``, each with weights and inputs fixed by a seed."""

from __future__ import annotations

import torch
from torch import nn

from checks.ranks.context import RankContext
from checks.workloads.gpt import batch
from mini_gpt import GPT, preset


class EdgeBlock(nn.Module):
    """A block built to hit the wrap code's edge cases: a ``MultiheadAttention`` (a forced leaf of the size
    policy), a ``BatchNorm1d`` (what mixed precision leaves alone) and two Linear layers, 288 and 264 elements,
    so that a threshold of 288 is crossed in the middle of the block."""

    def __init__(self, width: int = 8, hidden: int = 32) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(width, 2, batch_first=True)
        self.norm = nn.BatchNorm1d(width)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x, x, x, need_weights=False)[0]
        x = self.norm(x.transpose(1, 2)).transpose(1, 2)  # BatchNorm1d normalises dim 1: (batch, width, time)
        return x + self.down(torch.relu(self.up(x)))


class Edge(nn.Module):
    """An embedding whose weight the head shares (a tied parameter), two `EdgeBlock` in a ``ModuleList``, the head."""

    def __init__(self, vocab: int = 16, width: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList([EdgeBlock(width), EdgeBlock(width)])
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build(workload: str, device: torch.device | str = "cpu", seed: int = 0) -> nn.Module:
    """``gpt`` (mini_gpt tiny), ``edge`` (`Edge`) or ``transformer`` (torch's ``nn.Transformer``, 2 + 2 layers of
    width 16), with weights that depend on ``seed`` alone."""
    if workload == "gpt":
        return GPT(preset("tiny"), seed=seed).to(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if workload == "edge":
            model: nn.Module = Edge()
        elif workload == "transformer":
            model = nn.Transformer(d_model=16, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
                                   dim_feedforward=32, dropout=0.0, batch_first=True)  # fmt: skip
        else:
            raise ValueError(f"unknown workload {workload!r}")
    return model.to(device)


def step_loss(model: nn.Module, ctx: RankContext, workload: str, step: int = 0) -> torch.Tensor:
    """This rank's loss on its own inputs of ``step``."""
    generator = torch.Generator().manual_seed(97 * step + ctx.rank)
    if workload == "gpt":
        return model(*batch(ctx, step=step))[1]
    if workload == "edge":
        return model(torch.randint(0, 16, (2, 5), generator=generator).to(ctx.device)).float().sum()
    source, target = (torch.randn(2, 5, 16, generator=generator).to(ctx.device) for _ in range(2))
    return model(source, target).float().sum()
