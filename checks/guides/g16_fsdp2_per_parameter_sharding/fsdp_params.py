"""The drawn model under ``fully_shard`` and what FSDP2 made of it: its sharded modules, their parameter groups,
each parameter's ``FSDPParam``, and the storage behind a tensor (the claims compare data pointers, not values)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from checks.models.fsdp2_draws import groups_of
from checks.ranks.context import RankContext
from checks.workloads.drawn_fsdp2 import build


def wrap(ctx: RankContext, model: dict[str, Any]) -> nn.Module:
    """``fully_shard`` on the child (if any), then on the root, over a 1-D cpu mesh of all ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    module = build(model).to(ctx.device)
    if model["child"] is not None:
        fully_shard(module.c, mesh=mesh)
    return fully_shard(module, mesh=mesh)


def fsdp_modules(module: nn.Module, model: dict[str, Any]) -> dict[str, nn.Module]:
    """The modules ``fully_shard`` was applied to, by prefix, child first (`groups_of`'s order)."""
    return {prefix: module.get_submodule(prefix) for prefix in groups_of(model)}


def param_groups_of(module: nn.Module) -> list[Any]:
    """The ``FSDPParamGroup`` s of one ``fully_shard`` ed module."""
    state = module._get_fsdp_state()
    return [g for g in (getattr(state, "_fsdp_param_groups", None) or [state._fsdp_param_group]) if g is not None]


def fsdp_params_of(module: nn.Module) -> list[Any]:
    """The ``FSDPParam`` s of one ``fully_shard`` ed module, in its group's order."""
    return [fsdp_param for group in param_groups_of(module) for fsdp_param in group.fsdp_params]


def by_fqn(module: nn.Module, model: dict[str, Any]) -> dict[str, Any]:
    """Each parameter's ``FSDPParam``, by fqn, matched by identity with the module's sharded parameter."""
    found: dict[str, Any] = {}
    for prefix, sub in fsdp_modules(module, model).items():
        for fsdp_param in fsdp_params_of(sub):
            for fqn in groups_of(model)[prefix]:
                if module.get_parameter(fqn) is fsdp_param.sharded_param:
                    found[fqn] = fsdp_param
    return found


def storage_of(tensor: torch.Tensor) -> tuple[int, int]:
    """(data pointer, bytes) of the storage behind ``tensor``."""
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()
