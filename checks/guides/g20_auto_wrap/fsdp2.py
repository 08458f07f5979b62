"""FSDP2 by hand: ``fully_shard`` on the modules FSDP1's policy makes units, children first, gives the same
groups; the root's call first makes every parameter a DTensor, and a child's call after it fails."""

from __future__ import annotations

from typing import Any

from checks.expected import Expected
from checks.guides.g20_auto_wrap.wrapping import error_line, require_step_runs, require_units_stated
from checks.models import wrap as wm
from checks.probes.built_units import fsdp2_group
from checks.ranks.context import RankContext
from checks.violation import require_equal
from checks.workloads.edge import build
from checks.workloads.module_tree import tree_of
from checks.workloads.wrap_policies import model_policy
from mini_gpt.model import Block


def _mesh(ctx: RankContext, names: tuple[str, ...] | None = None) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(ctx.device.type, (ctx.world_size,), mesh_dim_names=names)


def fsdp2_matches_fsdp1(ctx: RankContext, workload: str, policy: dict[str, Any], expected: Expected) -> dict[str, Any]:
    """``fully_shard`` on each module the FSDP1 policy would make a unit, in the model's build order (children
    first, the root last): each call's group holds exactly what FSDP1's unit holds (the same parameters; the
    order is FSDP2's post-order, as the model says); a step runs. The units are the guide's rows."""
    from torch.distributed.fsdp import fully_shard

    tree = tree_of(build(workload))
    predicted = wm.wrap(tree, model_policy(policy))
    require_units_stated(expected, predicted)  # so each unit's call and group has its row
    groups = wm.fsdp2_groups(tree, [u.path for u in predicted.units])
    model = build(workload, ctx.device)
    mesh = _mesh(ctx)
    modules = dict(model.named_modules())
    observed = {}
    for unit in predicted.units:
        try:
            fully_shard(modules[unit.path], mesh=mesh)
        except Exception as error:
            raised = f"{type(error).__name__}: {error}"
            expected.fail(expected.row(unit.name), "fully-shard-failed", f"fully_shard({unit.name}) raised {raised}",
                          unit=unit.name, error=raised)  # fmt: skip
    for unit, group in zip(predicted.units, groups, strict=True):
        observed[unit.name] = fsdp2_group(modules[unit.path])
        _require_group(expected, unit.name, observed[unit.name], [name for name, _ in group.params],
                       reason="group-differs-from-model", what="the FSDP2 group's parameters, in order")  # fmt: skip
        _require_group(expected, unit.name, sorted(observed[unit.name]), sorted(name for name, _ in unit.params),
                       reason="group-differs-from-fsdp1", what="FSDP2's group against FSDP1's unit")  # fmt: skip
    require_step_runs(model, ctx, workload, "fully_shard")
    return {"groups": observed, "units": predicted.names}


def _require_group(expected: Expected, unit: str, observed: list[str], want: list[str], *, reason: str,
                   what: str) -> None:  # fmt: skip
    """A unit's FSDP2 group is what its row says FSDP1's unit holds; one that is not makes the row false."""
    expected.require(observed == want, expected.row(unit), reason, f"{unit}: {what}: {observed!r}, expected {want!r}",
                     observed=observed, expected=want, unit=unit)  # fmt: skip


def fsdp2_root_first(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """``fully_shard(model)`` and then ``fully_shard(model.blocks[0])``: the model says the root's call shards
    every parameter and a later call on any block finds every one of the block's parameters already sharded; they
    are all DTensors by then (checked block by block, then the whole model), and the call on ``blocks.0`` takes
    them for tensor-parallel ones and raises, on a mesh without dimension names and on one with, the guide's
    rows, one error each."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    unwrapped = build("gpt")
    blocks = [path for path, module in unwrapped.named_modules() if isinstance(module, Block)]
    root, *later = wm.fsdp2_groups(tree_of(unwrapped), ["", *blocks])
    seen = []
    for names in (None, ("dp",)):
        model = build("gpt", ctx.device)
        fully_shard(model, mesh=_mesh(ctx, names))
        modules = dict(model.named_modules())
        for group in later:
            as_dtensors = [name for name, p in modules[group.path].named_parameters() if isinstance(p, DTensor)]
            require_equal(as_dtensors, list(group.already_sharded), reason="not-already-sharded",
                          what=f"{group.path}: its parameters that are DTensors before its own call",
                          block=group.path)  # fmt: skip
        everywhere = sorted(name for name, p in model.named_parameters() if isinstance(p, DTensor))
        require_equal(everywhere, sorted(name for name, _ in root.params), reason="not-every-parameter-sharded",
                      what="the model's parameters that are DTensors after the root's call")  # fmt: skip
        try:
            fully_shard(model.blocks[0], mesh=_mesh(ctx, names))
        except Exception as error:
            seen.append(error_line(error))
        else:
            seen.append("no error")
    expected.require_rows(seen, reason="wrong-order-not-refused", what="the child's call after the root's")
    return {"errors": seen, "already_sharded": {group.path: len(group.already_sharded) for group in later}}
