"""The units a policy forms: for each policy of a claim, the wrap model's units are the units FSDP1 builds, in the
model's order, by the model's walk, and they are the guide's unit rows; the size policy's defaults."""

from __future__ import annotations

from typing import Any

from checks.expected import Expected
from checks.guides.g20_auto_wrap.wrapping import (
    expected_units,
    mixed_precision_of,
    require_built_in_order,
    require_step_runs,
    require_units_built,
    require_units_stated,
    walk_counts,
    wrap_fsdp1,
)
from checks.models import wrap as wm
from checks.probes.built_units import fsdp1_units
from checks.ranks.context import RankContext
from checks.violation import require_equal
from checks.workloads.edge import build
from checks.workloads.module_tree import module_paths, tree_of
from checks.workloads.wrap_policies import model_policy, torch_policy


def units_match_model(ctx: RankContext, workload: str, policies: list[dict[str, Any]], expected: Expected, *,
                      param_dtype: str | None = None, run_step: bool = True) -> dict[str, Any]:  # fmt: skip
    """For each policy (all must form the same units): the wrap model's units from the unwrapped model's tree are
    the units FSDP1 builds (module, flat-parameter contents in order, shared parameters, settings), built in the
    model's order by the model's walk; one step then runs. The units, written out, are the guide's rows."""
    lines: list[str] = []
    observed: dict[str, Any] = {}
    ignore = wm.MODULE_CLASSES_TO_IGNORE if param_dtype else None
    for spec in policies:
        model = build(workload, ctx.device)
        paths = module_paths(model)
        predicted = wm.wrap(tree_of(model), model_policy(spec), mixed_precision_ignore=ignore)
        lines = require_units_stated(expected, predicted)
        wrapped, watched, _ = wrap_fsdp1(model, ctx, torch_policy(spec, paths), paths,
                                         mixed_precision=mixed_precision_of(param_dtype))  # fmt: skip
        kind = spec["kind"]
        require_units_built(expected, fsdp1_units(wrapped), expected_units(predicted, param_dtype),
                            what=f"{kind} policy: the units FSDP built", policy=kind)  # fmt: skip
        require_built_in_order(expected, watched.built, what=f"{kind} policy: the order the units' handles were built",
                               policy=kind)  # fmt: skip
        require_equal(watched.counts, walk_counts(predicted), reason="walk-differs",
                      what=f"{kind} policy: calls of each walk", policy=kind)  # fmt: skip
        if run_step:
            require_step_runs(wrapped, ctx, workload, kind)
        observed[kind] = {"units": predicted.names, "walk": watched.counts}
    return {"units": lines, "unit_count": len(lines), "by_policy": observed}


def size_defaults(ctx: RankContext) -> dict[str, Any]:
    """``size_based_auto_wrap_policy``'s defaults are the model's: ``min_num_params`` is ``int(1e8)``, and None
    for ``force_leaf_modules`` / ``exclude_wrap_modules`` reads the function's attributes,
    ``{nn.MultiheadAttention}`` and ``{nn.ModuleList, nn.ModuleDict}``; with the defaults mini_gpt tiny is one
    unit, the root, since no module reaches 1e8 elements."""
    import inspect

    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    default = inspect.signature(size_based_auto_wrap_policy).parameters["min_num_params"].default
    attributes = {
        "min_num_params": default,
        "FORCE_LEAF_MODULES": sorted(c.__name__ for c in size_based_auto_wrap_policy.FORCE_LEAF_MODULES),
        "EXCLUDE_WRAP_MODULES": sorted(c.__name__ for c in size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES),
    }
    require_equal(attributes, {"min_num_params": wm.DEFAULT_MIN_NUM_PARAMS,
                               "FORCE_LEAF_MODULES": sorted(wm.FORCE_LEAF_MODULES),
                               "EXCLUDE_WRAP_MODULES": sorted(wm.EXCLUDE_WRAP_MODULES)},
                  reason="defaults-differ", what="size_based_auto_wrap_policy's defaults")  # fmt: skip
    model = build("gpt", ctx.device)
    paths = module_paths(model)
    wrapped, watched, _ = wrap_fsdp1(model, ctx, size_based_auto_wrap_policy, paths)
    predicted = wm.wrap(tree_of(build("gpt")), wm.SizeBased())
    require_equal(sorted(fsdp1_units(wrapped)), predicted.names, reason="units-differ-from-model",
                  what="units with every default")  # fmt: skip
    require_equal(watched.counts, walk_counts(predicted), reason="walk-differs", what="calls of each walk")
    return {**attributes, "units": predicted.names}
