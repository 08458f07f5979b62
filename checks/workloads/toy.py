"""The toy model the probes are proven on, and one wrapper per strategy (DDP, FSDP1, FSDP2, ZeRO-1).

``Sequential(Linear(3, 7), Linear(7, 5), Linear(5, 5))``: three children with parameter counts 28, 40 and 30
(|θ| = 98), small enough that every flat-parameter size, padding and ring-model byte count can be worked out by
hand, yet the shape of a real "root + blocks" model: children ``0`` and ``1`` are wrapped as units and the root
keeps child ``2``, the output layer (like a language model's head), so the root's pre-backward runs first and its
post-backward last. The units' 28 and 40 divide by 2 and 4, the root's 30 by 2 but not by 4: FSDP1's world-size
padding is exercised at N=4 and not at N=2. FSDP2 pads every parameter's dim 0 (7 and 5 rows) at both.

Structure matters for orders: if the root kept the *first* layer instead, the last unit's output would be the
model's output too, and the last unit's pre-backward hook would run before the root's (both hooks sit on the same
tensor, in registration order).

Every builder is deterministic on its own (a forked RNG with a fixed seed), so a check can build the same model
twice (DDP vs FSDP) and ranks always start from identical weights; inputs differ per rank, as in training.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from checks.ranks.context import RankContext

TOY_LAYERS: tuple[tuple[int, int], ...] = ((3, 7), (7, 5), (5, 5))  # (in_features, out_features) per child
# Children wrapped as their own FSDP unit. The root keeps child "2", the output layer (like a language model's
# head): the root's own computation produces the model's output, so its pre-backward hook runs first.
DEFAULT_UNITS: tuple[str, ...] = ("0", "1")
IN_FEATURES = TOY_LAYERS[0][0]


def toy_model(device: torch.device | str = "cpu", seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """The toy model with weights that depend only on ``seed`` (not on the global RNG or on the rank)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(*(nn.Linear(i, o) for i, o in TOY_LAYERS))
    return model.to(device=device, dtype=dtype)


def toy_batch(ctx: RankContext, batch: int = 4, seed: int = 0, step: int = 0) -> torch.Tensor:
    """This rank's input for one step: different on every rank and step, reproducible."""
    generator = torch.Generator().manual_seed(1000 * seed + 97 * step + ctx.rank)
    return torch.randn(batch, IN_FEATURES, generator=generator).to(ctx.device)


def train_step(model: nn.Module, optim: torch.optim.Optimizer | None, x: torch.Tensor) -> torch.Tensor:
    """One step the way the probes' tests take it: forward, ``sum()`` loss, backward, optimizer step."""
    loss = model(x).sum()
    loss.backward()
    if optim is not None:
        optim.step()
        optim.zero_grad(set_to_none=True)
    return loss.detach()


def adam(params: Any, lr: float = 1e-2) -> torch.optim.Adam:
    """fp32 Adam: 8 bytes of state per parameter element plus a 4-byte ``step`` scalar per parameter tensor."""
    return torch.optim.Adam(params, lr=lr)


# -- wrappers ----------------------------------------------------------------------------------------------------
def wrap_ddp(model: nn.Module, ctx: RankContext, **kwargs: Any) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [ctx.device] if ctx.on_gpu else None
    return DistributedDataParallel(model, device_ids=device_ids, **kwargs)


def wrap_fsdp1(
    model: nn.Module,
    ctx: RankContext,
    *,
    strategy: str = "FULL_SHARD",
    units: Sequence[str] = DEFAULT_UNITS,
    backward_prefetch: str | None = "BACKWARD_PRE",
    forward_prefetch: bool = False,
    use_orig_params: bool = False,
    **kwargs: Any,
) -> nn.Module:
    """FSDP1 (the wrapper class): each named child in ``units`` becomes its own FSDP unit, then the root.

    ``strategy`` and ``backward_prefetch`` are enum member names (``"SHARD_GRAD_OP"``, ``"BACKWARD_POST"``, or
    None for no backward prefetch), so they can travel in a `CheckRequest`'s kwargs.
    """
    from torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel, ShardingStrategy

    options = {
        "device_id": ctx.device,
        "sharding_strategy": ShardingStrategy[strategy],
        "backward_prefetch": BackwardPrefetch[backward_prefetch] if backward_prefetch else None,
        "forward_prefetch": forward_prefetch,
        "use_orig_params": use_orig_params,
        **kwargs,
    }
    for name in units:
        setattr(model, name, FullyShardedDataParallel(getattr(model, name), **options))
    return FullyShardedDataParallel(model, **options)


def wrap_fsdp2(
    model: nn.Module,
    ctx: RankContext,
    *,
    units: Sequence[str] = DEFAULT_UNITS,
    reshard_after_forward: bool | int = True,
    **kwargs: Any,
) -> nn.Module:
    """FSDP2: ``fully_shard`` on each named child in ``units``, then on the root, over a 1-D mesh of all ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for name in units:
        fully_shard(getattr(model, name), mesh=mesh, reshard_after_forward=reshard_after_forward, **kwargs)
    return fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, **kwargs)


def wrap_zero(
    model: nn.Module, ctx: RankContext, lr: float = 1e-2, **kwargs: Any
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """DDP plus `ZeroRedundancyOptimizer` over Adam: ZeRO-1, optimizer state sharded by a greedy partition."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    ddp = wrap_ddp(model, ctx)
    optim = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=lr, **kwargs)
    return ddp, optim
