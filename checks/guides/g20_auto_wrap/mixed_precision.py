"""Mixed precision leaves BatchNorm alone: with ``MixedPrecision(param_dtype=bf16)`` each BatchNorm is a unit of
its own with mixed precision off, under a ``_Policy`` (targets added) and a callable (an or-ed policy), and its
casting hooks make it compute in float32 between bfloat16 layers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from checks.expected import Expected
from checks.guides.g20_auto_wrap.wrapping import (
    expected_units,
    mixed_precision_of,
    require_built_in_order,
    require_units_built,
    require_units_stated,
    wrap_fsdp1,
)
from checks.models import wrap as wm
from checks.probes.built_units import dtype_name, fsdp1_units
from checks.ranks.context import RankContext
from checks.violation import require
from checks.workloads.edge import build
from checks.workloads.module_tree import module_paths, tree_of
from checks.workloads.wrap_policies import model_policy, torch_policy


def mixed_precision_override(ctx: RankContext, policy: dict[str, Any], units: Expected,
                             dtypes: Expected) -> dict[str, Any]:  # fmt: skip
    """With ``MixedPrecision(param_dtype=bf16)`` every BatchNorm is a unit of its own with mixed precision off
    (the model's units, as in `units_match_model`, and the guide's ``units`` rows), FSDP warns once naming the
    class, and one forward computes as the guide's ``dtypes`` rows say: each unit's parameters, what the
    BatchNorm receives (its pre-hook runs after FSDP's cast), what the layer after it receives, and the output."""
    model = build("edge", ctx.device)
    paths = module_paths(model)
    block = {name: getattr(model.blocks[0], name) for name in ("attn", "norm", "up", "down")}  # before wrapping
    predicted = wm.wrap(tree_of(model), model_policy(policy), mixed_precision_ignore=wm.MODULE_CLASSES_TO_IGNORE)
    lines = require_units_stated(units, predicted)
    wrapped, watched, warned = wrap_fsdp1(
        model, ctx, torch_policy(policy, paths), paths, mixed_precision=mixed_precision_of("bfloat16")
    )
    kind = policy["kind"]
    require_units_built(units, fsdp1_units(wrapped), expected_units(predicted, "bfloat16"),
                        what=f"{kind} policy: the units FSDP built", policy=kind)  # fmt: skip
    require_built_in_order(units, watched.built, what="the order units were built")
    overridden = [w for w in warned if "Both mixed precision and an auto_wrap_policy" in w]
    require(len(overridden) == 1 and "BatchNorm1d" in overridden[0], "no-override-warning",
            f"expected one warning naming BatchNorm1d, got {overridden}", observed=overridden)  # fmt: skip
    seen = _forward_dtypes(wrapped, block, ctx)
    dtypes.require_values(seen, reason="dtypes-differ", what="dtypes in one forward")
    return {"units": lines, "unit_count": len(lines), "dtypes": seen}


def _forward_dtypes(wrapped: nn.Module, block: Mapping[str, nn.Module], ctx: RankContext) -> dict[str, str]:
    """One forward of the wrapped edge model: the dtype of the parameters of block 0's modules (``block``: the
    original modules, inside whatever wrapper they now sit in) while each computes, of the BatchNorm's input and
    of the next layer's input, and of the output."""
    seen: dict[str, str] = {}

    def params_of(name: str, module: nn.Module) -> Callable[..., None]:
        def hook(_: nn.Module, args: tuple[Any, ...]) -> None:
            seen.setdefault(f"{name} parameters", dtype_name(next(module.parameters()).dtype) or "")

        return hook

    def input_of(name: str) -> Callable[..., None]:
        def hook(_: nn.Module, args: tuple[Any, ...]) -> None:
            seen.setdefault(f"{name} input", dtype_name(args[0].dtype) or "")

        return hook

    handles = [block["norm"].register_forward_pre_hook(input_of("blocks.0.norm")),
               block["up"].register_forward_pre_hook(input_of("blocks.0.up"))]  # fmt: skip
    for name, module in block.items():
        handles.append(module.register_forward_pre_hook(params_of(f"blocks.0.{name}", module)))
    try:
        generator = torch.Generator().manual_seed(ctx.rank)
        out = wrapped(torch.randint(0, 16, (2, 5), generator=generator).to(ctx.device))
    finally:
        for handle in handles:
            handle.remove()
    seen["output"] = dtype_name(out.dtype) or ""
    return seen
