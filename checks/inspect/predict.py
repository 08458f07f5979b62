"""What the torch-free models say one FSDP step of a user's model does, from its structure alone: the units its
wrap policy forms (`checks.models.wrap`), each unit's layout and padding (FSDP1's flat parameter,
`checks.models.flat_param`; FSDP2's per-parameter dim-0 padding, `checks.models.fsdp2_shards`), each rank's bytes
by category after a step (`checks.models.zero_memory`), the step's collectives (`checks.models.comm_volume`) and
the backward prefetches (FSDP1 per mode, `checks.models.prefetch`; FSDP2's implicit one,
`checks.models.fsdp2_prefetch`). Torch-free: the input is the plain tree `checks.inspect.tree.tree_of` reads and
each parameter's shape.

FSDP2 shards the modules FSDP1's policy would make units, with one ``fully_shard`` call each in the wrap's build
order (children first, the root last), as guide 20's fsdp2-matches-fsdp1 claim does.

The post-forward order is an input: by default the units in the order the wrap built them (children before
parents, siblings in registration order), which is the order their forwards end in a model that runs its
children in registration order. A model that runs them otherwise gets the order torch recorded, and the report
says so (`checks.inspect.compare`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from checks.models import comm_volume, fsdp2_prefetch, prefetch
from checks.models import wrap as wm
from checks.models.flat_param import layout
from checks.models.fsdp2_shards import padded_shard_numel
from checks.models.zero_memory import Param, per_rank
from checks.naming import ROOT

# The strategies a run measures: FSDP1's sharded ones, and FSDP2 with each reshard_after_forward.
FSDP1 = {"full-shard": "FULL_SHARD", "shard-grad-op": "SHARD_GRAD_OP"}
FSDP2 = dict(comm_volume.FSDP2)  # strategy -> reshard_after_forward
MEASURED = (*FSDP1, *FSDP2)
FSDP1_MODES = ("BACKWARD_PRE", "BACKWARD_POST", None)
FSDP2_MODES = ("implicit",)
ELEMENT_BYTES = 4  # fp32: the run's parameters, gradients and collectives


def modes(strategy: str) -> tuple[str | None, ...]:
    return FSDP2_MODES if strategy in FSDP2 else FSDP1_MODES


def units_of(wrap: wm.Wrap) -> list[dict[str, Any]]:
    """Each FSDP1 unit as the report lists it: name, module class, what its flat parameter holds (name relative to
    the unit's module, elements), in flattening order, and the shared names it also holds."""
    return [
        {"name": u.name, "type": u.type, "params": [list(p) for p in u.params], "shared": list(u.shared)}
        for u in wrap.units
    ]


def fsdp2_units_of(tree: wm.Module, wrap: wm.Wrap) -> list[dict[str, Any]]:
    """The groups ``fully_shard`` forms on the same modules, each in FSDP2's order (`wm.fsdp2_groups`)."""
    groups = wm.fsdp2_groups(tree, [u.path for u in wrap.units])
    return [
        {"name": u.name, "type": u.type, "params": [list(p) for p in g.params], "shared": []}
        for u, g in zip(wrap.units, groups, strict=True)
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


def prefetch_hooks(strategy: str, order: Sequence[str], mode: str | None, root_params: bool) -> list[str]:
    """FSDP1: the prefetch model's hooks for ``mode``; FSDP2: the implicit path's prefetches, as ``prefetch A→B``
    events (`fsdp2_prefetch.step_sequence`), for inner units that end their forwards in ``order``."""
    if strategy in FSDP2:
        seq = fsdp2_prefetch.step_sequence(order, ROOT, reshard_after_forward=FSDP2[strategy], root_params=root_params)
        return [f"prefetch {pair}" for pair in fsdp2_prefetch.prefetches(seq, phase="backward")]
    hooks = [*order, ROOT] if root_params else list(order)
    return prefetch.backward_sequence(hooks, mode, root_params=root_params)


def _fsdp1_layout(numels: Sequence[int], world_size: int) -> dict[str, int]:
    lay = layout(numels, ELEMENT_BYTES, world_size)
    numel = sum(lay.numels)
    return {"numel": numel, "padded": lay.padded_numel, "shard": lay.shard_numel, "padding": lay.padded_numel - numel}


def _fsdp2_layout(shapes: Sequence[tuple[int, ...]], world_size: int) -> dict[str, int]:
    numel = sum(math.prod(s) for s in shapes)
    shard = sum(padded_shard_numel(s, world_size) for s in shapes)
    return {"numel": numel, "padded": shard * world_size, "shard": shard, "padding": shard * world_size - numel}


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
    """The prediction for one step of ``strategy`` (one of `MEASURED`) on ``world_size`` ranks, fp32 (FSDP1 with
    ``use_orig_params=True``), stepped by ``optimizer`` (`checks.models.zero_memory.OPTIMIZERS`)."""
    if strategy not in MEASURED:
        raise ValueError(f"inspect runs {', '.join(MEASURED)}, not {strategy!r}")
    wrap = wm.wrap(tree, policy)
    with_params = [u for u in wrap.units if u.params]
    if not with_params:
        raise ValueError("the model has no parameters: there is nothing to shard")
    params = parameters(wrap, shapes)
    by_unit = {u.name: [p.shape for p in params if p.unit == u.name] for u in with_params}
    if strategy in FSDP2:
        layouts = {name: _fsdp2_layout(s, world_size) for name, s in by_unit.items()}
        units = fsdp2_units_of(tree, wrap)
    else:
        layouts = {u.name: _fsdp1_layout(u.numels, world_size) for u in with_params}
        units = units_of(wrap)
    order = list(post_forward) if post_forward is not None else default_post_forward(wrap)
    root_params = ROOT in by_unit
    unit_shapes = {ROOT: by_unit.get(ROOT, []), **{u: s for u, s in by_unit.items() if u != ROOT}}
    backward = [*reversed(order)] if not root_params else [ROOT, *reversed(order)]
    volume = comm_volume.step(strategy, unit_shapes, world_size, root=ROOT, backward_order=backward)
    impl = "fsdp2" if strategy in FSDP2 else strategy
    memory = [per_rank(impl, params, world_size, rank, optim=optimizer).by_category() for rank in range(world_size)]
    return {
        "units": units,
        "layout": layouts,
        "memory": memory,
        "collectives": [{"op": o.op, "numel": o.numel, "backward": o.backward, "unit": o.unit} for o in volume.ops],
        "logical_bytes": volume.logical,
        "ring_bytes": float(volume.ring),
        "post_forward": order,
        "root_params": root_params,
        "modes": [str(m) for m in modes(strategy)],
        "prefetch": {str(m): prefetch_hooks(strategy, order, m, root_params) for m in modes(strategy)},
    }
