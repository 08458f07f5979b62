"""What the torch-free models say one FSDP1 step of a user's model does, from its structure alone: the units its
wrap policy forms (`checks.models.wrap`), each flat parameter's layout and padding (`checks.models.flat_param`),
each rank's bytes by category after a step (`checks.models.zero_memory`), the step's collectives
(`checks.models.comm_volume`) and each backward-prefetch mode's hooks (`checks.models.prefetch`). Torch-free:
the input is the plain tree `checks.inspect.tree.tree_of` reads and each parameter's shape.

The post-forward order is an input: by default the units in the order the wrap built them (children before
parents, siblings in registration order), which is the order their forwards end in a model that runs its
children in registration order. A model that runs them otherwise gets the order torch recorded, and the report
says so (`checks.inspect.compare`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from checks.models import comm_volume, prefetch
from checks.models import wrap as wm
from checks.models.flat_param import FlatLayout, layout
from checks.models.zero_memory import Param, per_rank
from checks.naming import ROOT

# The strategies a run measures: FSDP1's sharded ones (the wrap policy is FSDP1's auto_wrap_policy).
MEASURED = {"full-shard": "FULL_SHARD", "shard-grad-op": "SHARD_GRAD_OP"}
MODES = ("BACKWARD_PRE", "BACKWARD_POST", None)
ELEMENT_BYTES = 4  # fp32: the run's parameters, gradients and collectives


def units_of(wrap: wm.Wrap) -> list[dict[str, Any]]:
    """Each unit as the report lists it: name, module class, what its flat parameter holds (name relative to the
    unit's module, elements), in flattening order, and the shared names it also holds."""
    return [
        {"name": u.name, "type": u.type, "params": [list(p) for p in u.params], "shared": list(u.shared)}
        for u in wrap.units
    ]


def parameters(wrap: wm.Wrap, shapes: Mapping[str, tuple[int, ...]]) -> list[Param]:
    """The memory model's input: every flattened parameter with its unit and shape, unit by unit, each in its
    flattening order."""
    out = []
    for unit in wrap.units:
        for name, _ in unit.params:
            fqn = wm.join(unit.path, name)
            if fqn not in shapes:
                raise ValueError(f"{fqn}: flattened by unit {unit.name} but not among the model's parameters")
            out.append(Param(unit.name, fqn, tuple(shapes[fqn])))
    return out


def default_post_forward(wrap: wm.Wrap) -> list[str]:
    """Inner units holding parameters, in the order the wrap built them (see the module docstring)."""
    return [u.name for u in wrap.units if u.name != ROOT and u.params]


def predict(
    tree: wm.Module,
    shapes: Mapping[str, tuple[int, ...]],
    policy: wm.Policy | None,
    *,
    strategy: str,
    world_size: int,
    optimizer: str = "adamw",
    post_forward: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The prediction for one FSDP1 step of ``strategy`` (one of `MEASURED`) on ``world_size`` ranks, fp32,
    ``use_orig_params=True``, stepped by ``optimizer`` (`checks.models.zero_memory.OPTIMIZERS`)."""
    if strategy not in MEASURED:
        raise ValueError(f"inspect runs {', '.join(MEASURED)}, not {strategy!r}")
    wrap = wm.wrap(tree, policy)
    with_params = [u for u in wrap.units if u.params]
    if not with_params:
        raise ValueError("the model has no parameters: there is nothing to shard")
    layouts = {u.name: layout(u.numels, ELEMENT_BYTES, world_size) for u in with_params}
    params = parameters(wrap, shapes)
    order = list(post_forward) if post_forward is not None else default_post_forward(wrap)
    root_params = any(u.name == ROOT for u in with_params)
    unit_shapes = {ROOT: [p.shape for p in params if p.unit == ROOT]}
    unit_shapes.update({u.name: [p.shape for p in params if p.unit == u.name] for u in with_params if u.name != ROOT})
    backward = [*reversed(order)] if not root_params else [ROOT, *reversed(order)]
    volume = comm_volume.step(strategy, unit_shapes, world_size, root=ROOT, backward_order=backward)
    hooks = [*order, ROOT] if root_params else order
    memory = [per_rank(strategy, params, world_size, rank, optim=optimizer).by_category() for rank in range(world_size)]
    return {
        "units": units_of(wrap),
        "layout": {name: _layout_entry(lay) for name, lay in layouts.items()},
        "memory": memory,
        "collectives": [{"op": o.op, "numel": o.numel, "backward": o.backward, "unit": o.unit} for o in volume.ops],
        "logical_bytes": volume.logical,
        "ring_bytes": float(volume.ring),
        "post_forward": order,
        "prefetch": {str(mode): prefetch.backward_sequence(hooks, mode, root_params=root_params) for mode in MODES},
    }


def _layout_entry(lay: FlatLayout) -> dict[str, int]:
    numel = sum(lay.numels)
    return {"numel": numel, "padded": lay.padded_numel, "shard": lay.shard_numel, "padding": lay.padded_numel - numel}
