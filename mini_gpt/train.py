"""Single-process training: the reference that sharded runs are compared against."""

from collections.abc import Callable

import torch
from torch import nn

from mini_gpt.batches import BatchSampler, corpus_tokens
from mini_gpt.config import GPTConfig
from mini_gpt.model import GPT

OnStep = Callable[[int, float], None]  # called as on_step(step, loss) after every step


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    # No weight decay: runs are short, and plain Adam updates are easiest to compare across shardings.
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    """One optimisation step on (x, y); returns the loss before the update."""
    optimizer.zero_grad(set_to_none=True)
    _, loss = model(x, y)
    loss.backward()
    optimizer.step()
    return loss.item()


def fit(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    sampler: BatchSampler,
    steps: int,
    on_step: OnStep | None = None,
) -> list[float]:
    """Train `model` in place on global batches 0 … steps-1; returns the loss of every step."""
    model.train()
    losses = []
    for step in range(steps):
        x, y = sampler.global_batch(step)
        losses.append(train_step(model, optimizer, x, y))
        if on_step is not None:
            on_step(step, losses[-1])
    return losses


def train(
    config: GPTConfig,
    steps: int = 200,
    lr: float = 1e-2,
    batch_size: int = 32,
    seed: int = 0,
    *,
    on_step: OnStep | None = None,
) -> list[float]:
    """Train a fresh GPT(config, seed) on the shipped corpus; returns the per-step losses."""
    model = GPT(config, seed=seed)
    sampler = BatchSampler(corpus_tokens(), config.block_size, batch_size, seed=seed)
    return fit(model, make_optimizer(model, lr), sampler, steps, on_step)
