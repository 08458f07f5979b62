"""What FSDP built, read off a wrapped model (rank side, plain data): FSDP1's units, each with its module's class,
what its flat parameter holds, its shared parameters and its settings; the parameters of the group FSDP2's
``fully_shard`` gave a module. Guide 20 compares them with the wrap model, ``fsdp-readings inspect`` reports them."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from checks.naming import clean, unit_name


def dtype_name(dtype: torch.dtype | None) -> str | None:
    """``torch.bfloat16`` → ``bfloat16``; None stays None."""
    return None if dtype is None else str(dtype).removeprefix("torch.")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def fsdp1_units(model: nn.Module) -> dict[str, dict[str, Any]]:
    """Every FSDP unit of a wrapped model by name, in module order: its module's class, what its flat parameter
    holds ((name, elements), flattening order), its shared parameters' names, its parameter dtype setting and its
    sharding strategy."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    units = {}
    for path, module in model.named_modules():
        if not isinstance(module, FSDP):
            continue
        flat = module._handle.flat_param if module._handle is not None else None
        shared = (
            [_join(info.module_name, info.param_name) for info in flat._shared_param_infos] if flat is not None else []
        )
        units[unit_name(path)] = {
            "type": type(module.module).__name__,
            "params": [list(p) for p in zip(flat._fqns, flat._numels, strict=True)] if flat is not None else [],
            "shared": shared,
            "param_dtype": dtype_name(module.mixed_precision.param_dtype),
            "strategy": module.sharding_strategy.name,
        }
    return units


def fsdp2_group(module: nn.Module) -> list[str]:
    """The parameters of the group ``fully_shard`` gave ``module``, by name relative to it, in group order."""
    from torch.distributed.fsdp import fully_shard

    group = fully_shard.state(module)._fsdp_param_group
    if group is None:
        return []
    prefix = {id(m): clean(path) for path, m in module.named_modules()}
    return [_join(prefix[id(p._module_info.module)], p._module_info.param_name) for p in group.fsdp_params]
