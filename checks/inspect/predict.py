"""What the torch-free models say one FSDP step of a user's model does, from its structure alone: the units its
wrap policy forms (`checks.models.wrap`), each unit's layout and padding (FSDP1's flat parameter,
`checks.models.flat_param`; FSDP2's per-parameter dim-0 padding, `checks.models.fsdp2_shards`), each rank's bytes
by category after a step (`checks.models.zero_memory`), the step's collectives (`checks.models.comm_volume`) and
the backward prefetches (FSDP1 per mode, `checks.models.prefetch`; FSDP2's implicit one,
`checks.models.fsdp2_prefetch`). Under DDP (and DDP with ZeroRedundancyOptimizer) there are no units: the
gradient buckets (`checks.models.ddp_buckets`) take their place, and the optimizer's partition of parameters
(`checks.models.zero_partition`). Torch-free: the input is the plain tree `checks.workloads.module_tree.tree_of` reads,
each parameter's shape and each buffer's size.

FSDP2 shards the modules FSDP1's policy would make units, with one ``fully_shard`` call each in the wrap's build
order (children first, the root last), as guide 20's fsdp2-matches-fsdp1 claim does.

The post-forward order is an input: by default the units in the order the wrap built them (children before
parents, siblings in registration order), which is the order their forwards end in a model that runs its
children in registration order. A model that runs them otherwise gets the order torch recorded, and the report
says so (`checks.inspect.compare`). DDP's gradient-ready order is an input: autograd's, which no model here
predicts per parameter; the buckets and their all-reduces are predicted over the order torch recorded in the
first step (`with_ready_order`), and until then over the reverse of registration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from checks.models import comm_volume, cost, fsdp2_prefetch, prefetch
from checks.models import ddp_buckets as db
from checks.models import wrap as wm
from checks.models.flat_param import layout
from checks.models.fsdp2_shards import padded_shard_numel
from checks.models.zero_memory import Param, per_rank
from checks.models.zero_partition import greedy_partition
from checks.naming import ROOT

# The strategies a run measures: torch's own (DDP, with ZeroRedundancyOptimizer, FSDP1's three sharding
# strategies, FSDP2 with each reshard_after_forward) and guide 13's reference ZeRO stages (`checks.zero`).
DDP = {"ddp": "DDP", "torch-zero": "DDP + ZeroRedundancyOptimizer"}
FSDP1 = {"full-shard": "FULL_SHARD", "shard-grad-op": "SHARD_GRAD_OP", "no-shard": "NO_SHARD"}
FSDP2 = dict(comm_volume.FSDP2)  # strategy -> reshard_after_forward
REFERENCE = {"zero1": 1, "zero2": 2, "zero3": 3}  # strategy -> stage
MEASURED = (*DDP, *FSDP1, *FSDP2, *REFERENCE)
FSDP1_MODES = ("BACKWARD_PRE", "BACKWARD_POST", None)
FSDP2_MODES = ("implicit",)
ELEMENT_BYTES = 4  # fp32: the run's parameters, gradients and collectives
# DDP's buffer broadcast: `DistributedDataParallel.broadcast_bucket_size` (torch/nn/parallel/distributed.py),
# the limit `dist._broadcast_coalesced` gives its bucket assignment (c10d's comm.cpp)
BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024


@dataclass(frozen=True)
class Usage:
    """What the model's own step does with its parameters, an input as the post-forward order is: which require a
    gradient (static), and, from the unwrapped run every rank makes first (`checks.inspect.reach`), which got one,
    which modules ran and which returned a tensor needing a gradient. None: all of them (``--meta``, which runs
    nothing)."""

    trainable: frozenset[str] | None = None
    grads: frozenset[str] | None = None
    ran: frozenset[str] | None = None
    grad_output: frozenset[str] | None = None
    find_unused_parameters: bool = False
    returned_by: tuple[str, ...] = ()  # modules whose output the model returns as it is, in forward order

    def is_trainable(self, name: str) -> bool:
        return self.trainable is None or name in self.trainable

    def reached(self, name: str) -> bool:
        return self.grads is None or name in self.grads

    def runs(self, path: str) -> bool:
        return path == "" or self.ran is None or path in self.ran

    def needs_grad_output(self, path: str) -> bool:
        return self.grad_output is None or path in self.grad_output


EVERYTHING = Usage()


def modes(strategy: str) -> tuple[str | None, ...]:
    """The backward-prefetch settings a run measures: FSDP1's three, FSDP2's implicit one, none under DDP."""
    if strategy in DDP:
        return ()
    return FSDP2_MODES if strategy in FSDP2 else FSDP1_MODES


def label(strategy: str) -> str:
    """What the report calls the wrapped model whose gradients it holds against DDP's."""
    if strategy in REFERENCE:
        return f"ZeRO-{REFERENCE[strategy]} (reference)"
    return DDP.get(strategy, "FSDP")


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


def parameters(wrap: wm.Wrap, shapes: Mapping[str, tuple[int, ...]], usage: Usage = EVERYTHING) -> list[Param]:
    """The memory model's input: every flattened parameter with its unit, shape, and whether it is trained and
    reached (``usage``), unit by unit, each in its flattening order."""
    out = []
    for unit in wrap.units:
        for name, _ in unit.params:
            fqn = wm.join(unit.path, name)
            if fqn not in shapes:
                raise ValueError(f"{fqn}: flattened by unit {unit.name} but not among the model's parameters")
            out.append(Param(unit.name, fqn, tuple(shapes[fqn]), usage.is_trainable(fqn), usage.reached(fqn)))
    return out


def default_post_forward(wrap: wm.Wrap, usage: Usage = EVERYTHING) -> list[str]:
    """Inner units holding parameters whose forward runs, in the order the wrap built them (see the module
    docstring)."""
    return [u.name for u in wrap.units if u.name != ROOT and u.params and usage.runs(u.path)]


def prefetch_hooks(
    strategy: str,
    order: Sequence[str],
    mode: str | None,
    root_params: bool,
    *,
    parents: Mapping[str, str] | None = None,
    output_units: Sequence[str] = (),
) -> list[str]:
    """FSDP1: the prefetch model's hooks for ``mode``; FSDP2: the implicit path's prefetches, as ``prefetch A→B``
    events (`fsdp2_prefetch.step_sequence`), for inner units that end their forwards in ``order``. ``parents``:
    each nested unit's enclosing unit; ``output_units``: the units whose output the model returns as it is."""
    output_units = [u for u in output_units if u in order]
    if strategy in FSDP2:
        seq = fsdp2_prefetch.step_sequence(order, ROOT, reshard_after_forward=FSDP2[strategy], root_params=root_params,
                                           output_units=output_units)  # fmt: skip
        return [f"prefetch {pair}" for pair in fsdp2_prefetch.prefetches(seq, phase="backward")]
    hooks = [*order, ROOT] if root_params else list(order)
    parents = {u: p for u, p in (parents or {}).items() if u in order and p in order}
    return prefetch.backward_sequence(hooks, mode, root_params=root_params, parents=parents,
                                      output_units=output_units if root_params else ())  # fmt: skip


def nesting(wrap: wm.Wrap) -> dict[str, str]:
    """Each non-root unit nested in another non-root unit, and the nearest such unit."""
    paths = [u.path for u in wrap.units if u.path]
    out = {}
    for path in paths:
        enclosing = [p for p in paths if p != path and path.startswith(p + ".")]
        if enclosing:
            out[path] = max(enclosing, key=len)
    return out


def _fsdp1_layout(numels: Sequence[int], world_size: int, sharded: bool = True) -> dict[str, int]:
    lay = layout(numels, ELEMENT_BYTES, world_size, sharded=sharded)
    numel = sum(lay.numels)
    return {"numel": numel, "padded": lay.padded_numel, "shard": lay.shard_numel, "padding": lay.padded_numel - numel}


def _fsdp2_layout(shapes: Sequence[tuple[int, ...]], world_size: int) -> dict[str, int]:
    numel = sum(math.prod(s) for s in shapes)
    shard = sum(padded_shard_numel(s, world_size) for s in shapes)
    return {"numel": numel, "padded": shard * world_size, "shard": shard, "padding": shard * world_size - numel}


def fsdp_collectives(strategy: str, wrap: wm.Wrap, params: Sequence[Param], world_size: int, *,
                     order: Sequence[str], usage: Usage) -> list[dict[str, Any]]:  # fmt: skip
    """A steady FSDP step's collectives, unit by unit (`checks.models.comm_volume`'s step, restricted by
    ``usage``): forward all-gathers every unit whose forward runs; backward, in reverse post-forward order (the
    root first), all-gathers again each unit forward freed whose output needs a gradient (only such an output
    gets the pre-backward hook), and reduces each unit that has a gradient: FSDP1 its whole flat parameter,
    FSDP2 only the parameters that got one (``post_backward``'s ``fsdp_params_with_grad``); NO_SHARD
    all-reduces its whole flat parameter instead."""
    units = [u for u in wrap.units if u.params and usage.runs(u.path)]
    members = {u.name: [p for p in params if p.unit == u.name] for u in units}
    names = [*(u.name for u in units if u.name == ROOT), *(u.name for u in units if u.name != ROOT)]
    paths = {u.name: u.path for u in units}
    if strategy in FSDP2:
        padded = comm_volume.fsdp2_padded({n: [p.shape for p in members[n]] for n in names}, world_size)
        reduced = comm_volume.fsdp2_padded({n: [p.shape for p in members[n] if p.grad] for n in names}, world_size)
    else:
        numels = {n: [p.numel for p in members[n]] for n in names}
        padded = comm_volume.fsdp1_padded(numels, ELEMENT_BYTES, world_size, True)
        if strategy == "no-shard":
            padded = {n: layout(numels[n], ELEMENT_BYTES, world_size, sharded=False).padded_numel for n in names}
        reduced = {n: padded[n] if any(p.grad for p in members[n]) else 0 for n in names}
    backward = [n for n in [ROOT, *reversed(order)] if n in padded]
    ops = [] if strategy == "no-shard" else [("all_gather", padded[n], "forward", n) for n in names]
    if strategy != "no-shard":
        freed = comm_volume.freed_after_forward(strategy, names, ROOT)
        # A unit is unsharded in backward by its own pre-backward (only an output that needs a gradient gets the
        # hook), or prefetched by the pre-backward of the unit after it in post-forward order (FSDP1's
        # BACKWARD_PRE, FSDP2's implicit prefetch), which happens even to a unit whose own backward never runs.
        sequence = [n for n in [*order, ROOT] if n in padded]
        hooked = {n for n in sequence if n == ROOT or usage.needs_grad_output(paths[n])}
        prefetched = {sequence[i - 1] for i, n in enumerate(sequence) if n in hooked and i > 0}
        ops += [("all_gather", padded[n], "backward", n) for n in backward
                if n in freed and n in hooked | prefetched]  # fmt: skip
    kind = "all_reduce" if strategy == "no-shard" else "reduce_scatter"
    ops += [(kind, reduced[n], "backward", n) for n in backward if reduced[n]]
    return [{"op": op, "numel": numel, "phase": phase, "unit": unit} for op, numel, phase, unit in ops]


def predict(
    tree: wm.Module,
    shapes: Mapping[str, tuple[int, ...]],
    policy: wm.Policy | None,
    *,
    strategy: str,
    world_size: int,
    optimizer: str = "adamw",
    post_forward: Sequence[str] | None = None,
    buffers: Sequence[db.Param] = (),
    usage: Usage = EVERYTHING,
) -> dict[str, Any]:
    """The prediction for one step of ``strategy`` (one of `MEASURED`) on ``world_size`` ranks, fp32 (FSDP1 with
    ``use_orig_params=True``), stepped by ``optimizer`` (`checks.models.zero_memory.OPTIMIZERS`). ``buffers``:
    the model's buffers in ``named_buffers()`` order (DDP broadcasts them in every forward); ``usage``: which
    parameters are trained and reached, and which modules run (`Usage`)."""
    if strategy not in MEASURED:
        raise ValueError(f"inspect runs {', '.join(MEASURED)}, not {strategy!r}")
    if not shapes:
        raise ValueError("the model has no parameters: there is nothing to shard")
    if strategy in DDP:
        return ddp(shapes, buffers, strategy=strategy, world_size=world_size, optimizer=optimizer, usage=usage)
    wrap = wm.wrap(tree, policy)
    if strategy in REFERENCE:
        return reference(tree, wrap, shapes, strategy=strategy, world_size=world_size, optimizer=optimizer,
                         usage=usage)  # fmt: skip
    with_params = [u for u in wrap.units if u.params]
    params = parameters(wrap, shapes, usage)
    by_unit = {u.name: [p.shape for p in params if p.unit == u.name] for u in with_params}
    if strategy in FSDP2:
        layouts = {name: _fsdp2_layout(s, world_size) for name, s in by_unit.items()}
        units = fsdp2_units_of(tree, wrap)
    else:
        sharded = strategy != "no-shard"
        layouts = {u.name: _fsdp1_layout(u.numels, world_size, sharded) for u in with_params}
        units = units_of(wrap)
    order = list(post_forward) if post_forward is not None else default_post_forward(wrap, usage)
    root_params = ROOT in by_unit
    impl = "fsdp2" if strategy in FSDP2 else strategy
    memory = [per_rank(impl, params, world_size, rank, optim=optimizer).by_category() for rank in range(world_size)]
    collectives = fsdp_collectives(strategy, wrap, params, world_size, order=order, usage=usage)
    parents = nesting(wrap)
    unit_paths = {u.path for u in with_params if u.path}
    output_units = [p for p in usage.returned_by if p in unit_paths]
    return {
        "units": units,
        "layout": layouts,
        "memory": memory,
        "collectives": collectives,
        "post_forward": order,
        "root_params": root_params,
        "parents": parents,
        "output_units": output_units,
        "modes": [str(m) for m in modes(strategy)],
        "prefetch": {
            str(m): prefetch_hooks(strategy, order, m, root_params, parents=parents, output_units=output_units)
            for m in modes(strategy)
        },
    }


def with_ready_order(prediction: dict[str, Any], shapes: Mapping[str, tuple[int, ...]], buffers: Sequence[db.Param],
                     ready: Sequence[int]) -> dict[str, Any]:  # fmt: skip
    """A DDP prediction over the gradient-ready order ``ready`` (parameter indices): its buckets and collectives.
    With ``find_unused_parameters`` the reducer never rebuilds, so the order changes nothing."""
    if prediction["find_unused_parameters"]:
        return prediction
    trained = prediction["trained"]
    buckets = ddp_buckets(shapes, trained, ready)
    collectives = ddp_collectives(
        shapes, trained, buckets, buffers, prediction["partition"], find_unused_parameters=False
    )
    return {**prediction, "buckets": buckets, "collectives": collectives}


def ddp_buckets(shapes: Mapping[str, tuple[int, ...]], trained: Sequence[int], ready: Sequence[int] | None = None,
                find_unused_parameters: bool = False) -> list[list[int]]:  # fmt: skip
    """The reducer's buckets over the parameters that require a gradient (``trained``, indices in registration
    order; the reducer has no others), as those indices. From the second iteration on (its default caps):
    rebuilt over the gradient-ready order of the first (`checks.models.ddp_buckets.rebuilt_buckets`); with
    ``find_unused_parameters``, never rebuilt: the initial ones (`checks.models.ddp_buckets.initial_buckets`)."""
    sizes = [math.prod(s) for s in shapes.values()]
    params = [db.Param(sizes[i]) for i in trained]
    local = {index: position for position, index in enumerate(trained)}
    if find_unused_parameters:
        buckets = db.initial_buckets(params, db.Options(find_unused_parameters=True))
    else:
        order = [local[i] for i in ready if i in local] if ready is not None else list(reversed(range(len(params))))
        buckets = db.rebuilt_buckets(params, order)
    return [[trained[position] for position in bucket] for bucket in buckets]


def buffer_broadcasts(buffers: Sequence[db.Param]) -> list[db.Param]:
    """What DDP's ``_sync_buffers`` broadcasts before each forward: the buffers coalesced by
    ``compute_bucket_assignment_by_size`` under `BROADCAST_BUCKET_BYTES` (one flat tensor per bucket, a bucket
    per dtype), each as one `db.Param` of the bucket's elements and dtype."""
    if not buffers:
        return []
    buckets = db.assign(buffers, [BROADCAST_BUCKET_BYTES])
    first = [buffers[bucket[0]] for bucket in buckets]
    return [
        db.Param(n, b.element_size, b.dtype) for n, b in zip(db.bucket_numels(buffers, buckets), first, strict=True)
    ]


def ddp_collectives(
    shapes: Mapping[str, tuple[int, ...]],
    trained: Sequence[int],
    buckets: Sequence[Sequence[int]],
    buffers: Sequence[db.Param],
    partition: Sequence[Sequence[str]] | None,
    *,
    find_unused_parameters: bool,
) -> list[dict[str, Any]]:
    """A steady DDP step: the buffers' broadcasts before forward, one all-reduce per bucket in backward (with
    ``find_unused_parameters`` one more, of the used-parameter map: an int32 per parameter in the reducer), and
    with ZeroRedundancyOptimizer (``partition``) one broadcast per parameter in the step, each from its owner
    (``_sync_params``: ``parameters_as_bucket_view=False``, the default; the partition holds frozen ones too)."""
    numels = [math.prod(s) for s in shapes.values()]
    ops = [{"op": "broadcast", "numel": b.numel, "phase": "forward"} for b in buffer_broadcasts(buffers)]
    ops += [{"op": "all_reduce", "numel": sum(numels[i] for i in bucket), "phase": "backward"} for bucket in buckets]
    if find_unused_parameters:
        ops.append({"op": "all_reduce", "numel": len(trained), "phase": "backward"})
    if partition is not None:
        ops += [{"op": "broadcast", "numel": math.prod(shapes[name]), "phase": "step"}
                for owned in partition for name in owned]  # fmt: skip
    return ops


def ddp(shapes: Mapping[str, tuple[int, ...]], buffers: Sequence[db.Param], *, strategy: str, world_size: int,
        optimizer: str, usage: Usage = EVERYTHING) -> dict[str, Any]:  # fmt: skip
    """DDP's step, and with ZeroRedundancyOptimizer its partition: no units; buckets instead (see `predict`). A
    parameter gets a gradient when some rank's backward reaches it (the all-reduce gives it to every rank)."""
    params = [Param(ROOT, name, tuple(shape), usage.is_trainable(name), usage.reached(name))
              for name, shape in shapes.items()]  # DDP's order: registration  # fmt: skip
    trained = [i for i, p in enumerate(params) if p.trainable]
    partition = None
    if strategy == "torch-zero":
        partition = [[name for name, _ in owned] for owned in greedy_partition([(p.name, p.numel) for p in params],
                                                                              world_size)]  # fmt: skip
    unused = usage.find_unused_parameters
    buckets = ddp_buckets(shapes, trained, find_unused_parameters=unused)
    collectives = ddp_collectives(shapes, trained, buckets, buffers, partition, find_unused_parameters=unused)
    return {
        "units": [],
        "layout": {},
        "memory": [
            per_rank(strategy, params, world_size, rank, optim=optimizer).by_category() for rank in range(world_size)
        ],
        "collectives": collectives,
        "post_forward": [],
        "root_params": True,
        "modes": [],
        "prefetch": {},
        "parameters": list(shapes),
        "sizes": [math.prod(s) for s in shapes.values()],
        "trained": trained,
        "find_unused_parameters": unused,
        "buckets": buckets,
        "partition": partition,
    }


class NestedGroups(ValueError):
    """Units inside units, which the reference ZeRO stages do not take: a refusal, not bad input."""

    reason = "nested-units-under-reference-zero"


def group_paths(wrap: wm.Wrap) -> list[str]:
    """The submodules the reference ZeRO stages make groups of their own: the policy's units but the root, in
    construction order. Refused when one sits inside another: `checks.zero.groups.module_groups` gives each
    parameter to the first group whose path prefixes it, which is FSDP's rule only for groups that do not nest."""
    paths = [u.path for u in wrap.units if u.name != ROOT]
    for inner in paths:
        for outer in paths:
            if inner != outer and inner.startswith(outer + "."):
                raise NestedGroups(f"the reference ZeRO stages take groups that do not nest, and {inner} is "
                                   f"inside {outer}: pick a --wrap whose units do not nest, or an FSDP "
                                   "strategy")  # fmt: skip
    return paths


def reference_groups(wrap: wm.Wrap, shapes: Mapping[str, tuple[int, ...]],
                     usage: Usage = EVERYTHING) -> dict[str, list[str]]:  # fmt: skip
    """Each group's parameters by name (`checks.zero.groups.module_groups`' rule): every parameter that requires
    a gradient, in registration order, to the first group whose path prefixes its name, else to the root; the
    root first, and only groups that hold a parameter. A frozen parameter is in no group."""
    paths = group_paths(wrap)
    members: dict[str, list[str]] = {ROOT: [], **{p: [] for p in paths}}
    for name in shapes:
        if usage.is_trainable(name):
            members[next((p for p in paths if name.startswith(p + ".")), ROOT)].append(name)
    return {group: names for group, names in members.items() if names}


def reference(tree: wm.Module, wrap: wm.Wrap, shapes: Mapping[str, tuple[int, ...]], *, strategy: str,
              world_size: int, optimizer: str, usage: Usage = EVERYTHING) -> dict[str, Any]:  # fmt: skip
    """A reference ZeRO stage's step (`checks.zero`): one flat group per non-root unit and the root with the
    rest, each padded to a multiple of N; memory from `checks.models.zero_memory.reference`, collectives from
    ``estimate``'s model (`checks.models.cost.collectives`): ZeRO-1 and 2 reduce-scatter each group in backward
    and all-gather the updated shards in the optimizer's step; ZeRO-3 gathers in forward and again in backward
    (all but the root, which it keeps) and reduce-scatters."""
    groups = reference_groups(wrap, shapes, usage)
    types = {u.name: u.type for u in wrap.units}
    params = [Param(group, name, tuple(shapes[name])) for group, names in groups.items() for name in names]
    frozen = [Param(ROOT, name, tuple(shape), False) for name, shape in shapes.items() if not usage.is_trainable(name)]
    units = [{"name": g, "type": types.get(g, tree.type), "params": [[relative_name(n, g), math.prod(shapes[n])]
              for n in names], "shared": []} for g, names in groups.items()]  # fmt: skip
    layouts = {}
    for g, names in groups.items():
        numel = sum(math.prod(shapes[n]) for n in names)
        padded = -(-numel // world_size) * world_size
        layouts[g] = {"numel": numel, "padded": padded, "shard": padded // world_size, "padding": padded - numel}
    volume = cost.collectives(cost.Plan(tuple(params), world_size, strategy, root=ROOT))
    in_step = REFERENCE[strategy] < 3  # ZeRO-1 and 2 publish the updated shards after the step
    collectives = [{"op": o.op, "numel": o.numel, "unit": o.unit, "phase": "backward" if o.backward else
                    "step" if in_step and o.op == "all_gather" else "forward"} for o in volume.ops]  # fmt: skip
    return {
        "units": units,
        "layout": layouts,
        "memory": [
            per_rank(strategy, [*params, *frozen], world_size, rank, optim=optimizer).by_category()
            for rank in range(world_size)
        ],
        "collectives": collectives,
        "post_forward": [],
        "root_params": ROOT in groups,
        "modes": [],
        "prefetch": {},
        "groups": [g for g in groups if g != ROOT],
    }


def relative_name(name: str, group: str) -> str:
    """A parameter's name inside its reference ZeRO group's module (the whole name in the root's)."""
    return name if group == ROOT else name.removeprefix(group + ".")
