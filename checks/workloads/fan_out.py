"""`FanOut`, the model guide 07 trains: a root over three FSDP1 units, one per kind of output (none requiring
grad, two requiring grad, four of which only one does), whose outputs reach the loss by one consumer or two.
`fan_out` wraps it, `fan_out_batch` draws a rank's batch, `fan_out_loss` sums what it returns."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from checks.ranks.context import RankContext

FEATURES = 4
UNITS = ("frozen", "pair", "mixed")  # the root's children, each its own FSDP unit, in forward order


class Frozen(nn.Module):
    """Unit ``frozen``: its parameters require no grad and it reads the data, so its one output requires none."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(FEATURES, FEATURES)
        self.lin.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class Pair(nn.Module):
    """Unit ``pair``: two outputs, ``a(x)`` and ``b(x)``, both requiring grad."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(FEATURES, FEATURES)
        self.b = nn.Linear(FEATURES, FEATURES)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a(x), self.b(x)


class Mixed(nn.Module):
    """Unit ``mixed``: four outputs ``(y, y.detach(), y.argmax(-1), z)``, ``z`` computed under ``no_grad``. Only
    ``y`` requires grad: a detached tensor, an integer tensor and a tensor made without grad mode do not."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(FEATURES, FEATURES)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.lin(x)
        with torch.no_grad():
            z = self.lin(x)
        return y, y.detach(), y.argmax(-1), z


class FanOut(nn.Module):
    """The root: ``f = frozen(x)``, ``a, b = pair(f)``, ``y, ... = mixed(a + b)``; it returns two tensors that
    require grad, ``(head(y), head(b))``, or without ``head`` (a root that owns no parameters) ``(2y, 3b)``. ``b``
    reaches the loss through two consumers. Each unit's outputs are kept in ``outputs`` for the checks."""

    def __init__(self, head: bool = True) -> None:
        super().__init__()
        self.frozen = Frozen()
        self.pair = Pair()
        self.mixed = Mixed()
        self.head = nn.Linear(FEATURES, FEATURES) if head else None
        self.outputs: dict[str, tuple[torch.Tensor, ...]] = {}

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.frozen(x)
        a, b = self.pair(f)
        mixed = self.mixed(a + b)
        self.outputs = {"frozen": (f,), "pair": (a, b), "mixed": mixed}
        y = mixed[0]
        if self.head is None:
            return y * 2, b * 3
        return self.head(y), self.head(b)


def fan_out(ctx: RankContext, *, head: bool = True, seed: int = 0, **fsdp_kwargs: Any) -> FSDP:
    """The fan-out model with each child its own FSDP1 unit and the model the root (``use_orig_params=True``)."""
    fsdp_kwargs.setdefault("use_orig_params", True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = FanOut(head).to(ctx.device)
    for name in UNITS:
        setattr(model, name, FSDP(getattr(model, name), device_id=ctx.device, **fsdp_kwargs))
    return FSDP(model, device_id=ctx.device, **fsdp_kwargs)


def fan_out_batch(ctx: RankContext, step: int = 0, rows: int = 3) -> torch.Tensor:
    generator = torch.Generator().manual_seed(97 * step + ctx.rank)
    return torch.randn(rows, FEATURES, generator=generator).to(ctx.device)


def fan_out_loss(outputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The sum of every output: each reaches the loss."""
    return sum(o.sum() for o in outputs)  # type: ignore[return-value]
