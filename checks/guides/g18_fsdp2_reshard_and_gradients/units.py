"""Guide 18's units: mini_gpt's root and three blocks, each unit's padded size (the models' input) and its
``FSDPParamGroup``, for every subject of the guide."""

from __future__ import annotations

from typing import Any

from torch import nn

from checks.models import comm_volume as cv
from checks.naming import ROOT, unit_name
from checks.workloads.gpt import tiny_shapes

BLOCKS = ("blocks.0", "blocks.1", "blocks.2")
UNITS = (ROOT, *BLOCKS)


def padded(world_size: int) -> dict[str, int]:
    """Each unit's padded unsharded size (elements), root first: the model's input."""
    return cv.fsdp2_padded(tiny_shapes(), world_size)


def groups(model: nn.Module) -> dict[str, Any]:
    """Every ``FSDPParamGroup`` of the model by unit name (one per unit here)."""
    from torch.distributed.fsdp import FSDPModule

    found = {}
    for module in model.modules():
        if isinstance(module, FSDPModule):
            for group in module._get_fsdp_state()._fsdp_param_groups:
                found[unit_name(group._module_fqn)] = group
    return found
