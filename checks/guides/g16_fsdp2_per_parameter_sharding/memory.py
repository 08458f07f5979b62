"""Property (c), memory-is-shard-bytes-at-2 and -at-4: the distinct live storages behind a rank's parameters hold
exactly the spec's shard bytes, padding included, before and after an unshard and reshard."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from checks.guides.g16_fsdp2_per_parameter_sharding.fsdp_params import by_fqn, fsdp_modules, storage_of, wrap
from checks.models import fsdp2_shards as spec
from checks.models.fsdp2_draws import describe, params_of
from checks.ranks.context import RankContext
from checks.violation import require_equal
from checks.workloads.drawn_fsdp2 import DTYPES


def held_bytes(module: nn.Module, model: dict[str, Any]) -> int:
    """Bytes of the distinct live storages behind the rank's parameters: each DTensor's local tensor, each
    ``_sharded_param_data`` and each all-gather output (0 bytes while freed)."""
    storages: dict[int, int] = {}
    tensors = [p.to_local() if isinstance(p, DTensor) else p for p in module.parameters()]
    for fsdp_param in by_fqn(module, model).values():
        tensors += [fsdp_param._sharded_param_data, *fsdp_param.all_gather_outputs]
    for tensor in tensors:
        ptr, nbytes = storage_of(tensor)
        if nbytes:
            storages[ptr] = nbytes
    return sum(storages.values())


def shard_sizes(model: dict[str, Any]) -> list[tuple[tuple[int, ...], int]]:
    """(shape, itemsize) of every parameter, in `params_of`'s order: what the spec's byte counts read."""
    return [(shape, torch.empty(0, dtype=DTYPES[dtype]).element_size()) for _, shape, dtype in params_of(model)]


def check_memory(module: nn.Module, model: dict[str, Any], n: int, rank: int, when: str) -> dict[str, int]:
    """The rank holds the spec's shard bytes ``when``, or `Violation` ``memory-differs``."""
    params = shard_sizes(model)
    expected = spec.shard_bytes(params, n)
    observed = held_bytes(module, model)
    require_equal(observed, expected, reason="memory-differs", what=f"bytes held on rank {rank} {when}", when=when)
    return {"bytes": observed, "unpadded": spec.local_bytes(params, n, rank)}


def memory_is_shard_bytes(ctx: RankContext, example: dict[str, Any]) -> dict[str, Any]:
    """Property (c): after ``fully_shard``, and again after an unshard and a reshard of every group, a rank holds
    exactly the spec's shard bytes: its padded chunks, padding included, and no second copy."""
    module = wrap(ctx, example)
    before = ctx.agreed(check_memory, module, example, ctx.world_size, ctx.rank, "after fully_shard")
    for sub in fsdp_modules(module, example).values():
        sub.unshard()
        sub.reshard()
    ctx.agreed(check_memory, module, example, ctx.world_size, ctx.rank, "after unshard and reshard")
    return {"model": describe(example), **before}
