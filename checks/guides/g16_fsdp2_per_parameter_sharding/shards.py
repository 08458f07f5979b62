"""Property (a), shards-are-the-spec-at-2 and -at-4: every parameter a ``Shard(0)`` DTensor whose local tensor is
the spec's unpadded rows, and the padded ``_sharded_param_data`` behind it."""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.tensor import DTensor, Shard

from checks.guides.g16_fsdp2_per_parameter_sharding.fsdp_params import by_fqn, storage_of, wrap
from checks.guides.g16_fsdp2_per_parameter_sharding.replica_rows import expected_padded, expected_rows, require_same
from checks.models import fsdp2_shards as spec
from checks.models.fsdp2_draws import describe, params_of
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.drawn_fsdp2 import build


def _check_shards(module: nn.Module, model: dict[str, Any], n: int, rank: int) -> dict[str, Any]:
    replica = build(model)
    fsdp_params = by_fqn(module, model)
    seen: dict[str, Any] = {}
    for fqn, shape, dtype in params_of(model):
        param = module.get_parameter(fqn)
        require(isinstance(param, DTensor), "not-a-dtensor", f"{fqn} is a {type(param).__name__}", fqn=fqn)
        require_equal(tuple(param.placements), (Shard(0),), reason="placement-differs", what=f"{fqn} placements")
        require_equal(param.device_mesh.mesh.tolist(), list(range(n)), reason="mesh-differs", what=f"{fqn} mesh")
        require_equal(tuple(param.shape), shape, reason="global-shape-differs", what=f"{fqn} global shape")
        local = param.to_local()
        local_shape = spec.local_shape(shape, n, rank)
        require_equal(tuple(local.shape), local_shape, reason="local-shape-differs", what=f"{fqn} local shape")
        require_same(
            local, expected_rows(replica, fqn, shape, n, rank), reason="local-values-differ", what=f"{fqn} rows"
        )
        require(fqn in fsdp_params, "no-fsdp-param", f"no FSDPParam holds {fqn}", fqn=fqn)
        fsdp_param = fsdp_params[fqn]
        require_equal(
            tuple(fsdp_param.padded_sharded_param_size),
            spec.padded_shape(shape, n),
            reason="padded-size-differs",
            what=f"{fqn} padded_sharded_param_size",
        )
        data = fsdp_param._sharded_param_data
        require_same(
            data,
            expected_padded(replica, fqn, shape, n, rank),
            reason="sharded-param-data-differs",
            what=f"{fqn} _sharded_param_data",
        )
        if data.numel():
            require(
                local.numel() == 0 or storage_of(local) == storage_of(data),
                "local-not-a-view",
                f"{fqn}'s local tensor is not a view of _sharded_param_data",
                fqn=fqn,
            )
        seen[fqn] = {"local": list(local.shape), "padded": data.numel(), "dtype": dtype}
    return seen


def shards_match_spec(ctx: RankContext, example: dict[str, Any]) -> dict[str, Any]:
    """Property (a): every parameter is a ``Shard(0)`` DTensor on the mesh of all ranks, of its global shape; its
    local tensor is the spec's rows of the replica, unpadded; ``padded_sharded_param_size`` and the 1-D
    ``_sharded_param_data`` (the rows, then zeros) are the spec's; the local tensor is a view of that buffer."""
    module = wrap(ctx, example)
    seen = ctx.agreed(_check_shards, module, example, ctx.world_size, ctx.rank)
    return {"model": describe(example), "params": seen}
