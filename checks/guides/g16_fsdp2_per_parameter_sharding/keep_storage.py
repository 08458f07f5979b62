"""Property (e), reshard-keeps-storage-when-asked (torch 2.15) and reshard-frees-regardless-before-2-15: a reshard
asked to keep the unsharded storage keeps each all-gather output's N padded chunks where torch reads the option,
and frees them where it does not."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from checks.guides.g16_fsdp2_per_parameter_sharding.all_gather import check_unsharded
from checks.guides.g16_fsdp2_per_parameter_sharding.fsdp_params import (
    by_fqn,
    fsdp_modules,
    fsdp_params_of,
    storage_of,
    wrap,
)
from checks.guides.g16_fsdp2_per_parameter_sharding.memory import check_memory, held_bytes, shard_sizes
from checks.models import fsdp2_shards as spec
from checks.models.fsdp2_draws import describe, groups_of, params_of
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.drawn_fsdp2 import DTYPES


def _keep_storage(module: nn.Module, keep: bool) -> None:
    """Ask every ``FSDPParam`` of the model to keep (or free) its unsharded storage on reshard: through
    ``FSDPModule.set_keep_unsharded_storage`` where torch has it (2.15), else by setting the attribute that method
    sets on each ``FSDPParam`` (``_fully_shard.py`` on 2.15), which torch before 2.15 never reads."""
    if hasattr(module, "set_keep_unsharded_storage"):
        module.set_keep_unsharded_storage(keep)
        return
    for sub in module.modules():
        if hasattr(sub, "_get_fsdp_state"):
            for fsdp_param in fsdp_params_of(sub):
                fsdp_param.keep_unsharded_storage = keep


def _output_storages(fsdp_params: dict[str, Any], fqns: list[str]) -> dict[str, tuple[int, int]]:
    return {fqn: storage_of(fsdp_params[fqn].all_gather_outputs[0]) for fqn in fqns}


def _check_kept(
    module: nn.Module, fsdp_params: dict[str, Any], fqns: list[str], model: dict[str, Any], kept: bool
) -> None:
    """After a reshard asked to keep the storage: the sharded DTensor is back on the module either way; each
    all-gather output holds N padded chunks of bytes (spec) where the release keeps it, 0 bytes where it frees."""
    shapes = {fqn: (shape, DTYPES[dtype]) for fqn, shape, dtype in params_of(model)}
    n = torch.distributed.get_world_size()
    for fqn in fqns:
        fsdp_param = fsdp_params[fqn]
        require(module.get_parameter(fqn) is fsdp_param.sharded_param, "not-resharded", f"{fqn}", fqn=fqn)
        shape, dtype = shapes[fqn]
        whole = n * spec.padded_shard_numel(shape, n) * torch.empty(0, dtype=dtype).element_size()
        nbytes = fsdp_param.all_gather_outputs[0].untyped_storage().nbytes()
        if kept:
            require_equal(nbytes, whole, reason="storage-not-kept", what=f"{fqn}'s all-gather output bytes", fqn=fqn)
        else:
            require_equal(nbytes, 0, reason="unsharded-not-freed", what=f"{fqn}'s all-gather output bytes", fqn=fqn)


def keep_unsharded_storage(ctx: RankContext, example: dict[str, Any], kept: bool) -> dict[str, Any]:
    """Property (e): every ``FSDPParam`` asked to keep its unsharded storage, then each group unsharded and
    resharded, child first. With ``kept`` (2.15): the outputs keep their bytes, so a rank holds its shard bytes
    plus N times them for the groups resharded so far (spec), the next unshard reuses the same storage (same data
    pointers) and rebuilds the replica bitwise, and turning the option off frees the outputs at the next reshard.
    Without ``kept`` (before 2.15, where nothing reads the attribute): the reshard frees the outputs as always."""
    module, n = wrap(ctx, example), ctx.world_size
    fsdp_params = by_fqn(module, example)
    _keep_storage(module, True)
    params = shard_sizes(example)
    shards = dict(zip([fqn for fqn, _, _ in params_of(example)], params, strict=True))
    held = spec.shard_bytes(params, n)
    for prefix, sub in fsdp_modules(module, example).items():
        fqns = groups_of(example)[prefix]
        sub.unshard()
        first = _output_storages(fsdp_params, fqns)
        sub.reshard()
        ctx.agreed(_check_kept, module, fsdp_params, fqns, example, kept)
        if kept:
            held += n * spec.shard_bytes([shards[fqn] for fqn in fqns], n)
        require_equal(held_bytes(module, example), held, reason="memory-differs", what=f"bytes held after {prefix!r}")
        if kept:
            sub.unshard()
            again = _output_storages(fsdp_params, fqns)
            moved = [fqn for fqn in fqns if first[fqn][1] and again[fqn][0] != first[fqn][0]]
            require(not moved, "storage-moved", f"the all-gather outputs of {moved} moved on the next unshard")
            ctx.agreed(check_unsharded, module, fsdp_params, fqns, example, n)
            sub.reshard()
    _keep_storage(module, False)
    for sub in fsdp_modules(module, example).values():
        sub.unshard()
        sub.reshard()
    ctx.agreed(check_memory, module, example, n, ctx.rank, "after the option is turned off")
    return {"model": describe(example), "kept": kept, "bytes_while_kept": held}
