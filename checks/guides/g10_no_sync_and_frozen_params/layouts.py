"""mini_gpt tiny's flat parameters as guide 10's claims expect them, by the flat-parameter model
(`checks.models.flat_param`) over the model's own parameter sizes: the gradient kept inside ``no_sync`` and the
frozen parameter's place in its unit's shards."""

from __future__ import annotations

from checks.models.flat_param import FlatParamSpec, Param, flat_param
from checks.workloads.gpt import unit_parameters


def gpt_flat_params(world_size: int) -> dict[str, FlatParamSpec]:
    """Each tiny unit's flat parameter by the spec (``use_orig_params=True``, fp32), from the model's own sizes."""
    return {
        unit: flat_param([Param(name, (numel,)) for name, numel in params], world_size, use_orig_params=True)
        for unit, params in unit_parameters().items()
    }
