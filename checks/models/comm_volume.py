"""Bytes one training step communicates, per data-parallel strategy, from the parameter sizes alone (torch-free).

Two measures per collective of full payload S bytes on N ranks (the conventions of `checks.probes.collectives`):

- logical bytes: S itself (an all-reduce's tensor, an all-gather's output, a reduce-scatter's input);
- ring-model bytes: what each rank sends in a ring (`checks.models.ring`): 2(N−1)/N·S for an all-reduce,
  (N−1)/N·S for an all-gather or a reduce-scatter.

One step is forward, backward and the optimizer step. The collectives per strategy, for units u with padded
unsharded sizes P_u (elements; FSDP1 pads the flat parameter, FSDP2 each parameter's dim 0) and |θ| the model's
parameter elements (a tied weight once):

- DDP: all-reduces of the gradient buckets, |θ| elements in all, however they are bucketed.
- FSDP (FSDP1 FULL_SHARD / SHARD_GRAD_OP, FSDP2 ``reshard_after_forward`` True / None / False): forward all-gathers
  every unit; backward all-gathers again every unit that forward *freed*; backward reduce-scatters every unit.
  Which units forward frees is the strategy's whole difference:

  ==================================  ====================  =======================================
  strategy                            freed after forward   ring-model bytes / DDP's, no padding
  ==================================  ====================  =======================================
  FSDP1 FULL_SHARD                    every unit but root   (3|θ| − |root|) / (2|θ|)
  FSDP1 SHARD_GRAD_OP                 none                  1
  FSDP2 reshard_after_forward=True    every unit            3/2
  FSDP2 reshard_after_forward=None    every unit but root   (3|θ| − |root|) / (2|θ|)
  FSDP2 reshard_after_forward=False   none                  1
  ==================================  ====================  =======================================

  (N−1)/N cancels in every ratio: at any N the ratios are the same, and with padding they grow by P_u/|θ|.

  A unit given no parameters (an empty shape list: a root that holds none of its own) has no flat parameter
  (FSDP1: no handle) or parameter group (FSDP2) and issues no collective; the unit kept after forward is then
  nobody, so FULL_SHARD and FSDP2's default free every unit that has parameters.

gloo does not run a reduce-scatter as one: its profiler event for ``reduce_scatter_single`` is a
``gloo:all_reduce`` of the whole input (`checks.probes.crosscheck`). `gloo_step` re-counts a step that way: each
reduce-scatter becomes an all-reduce of S, whose ring-model bytes are twice the reduce-scatter's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from checks.models.flat_param import padded_numel
from checks.models.fsdp2_reshard import Setting, per_unit, post_forward_world_size
from checks.models.fsdp2_shards import padded_shard_numel
from checks.models.ring import ring_bytes

STRATEGIES = ("ddp", "full-shard", "shard-grad-op", "fsdp2", "fsdp2-default", "fsdp2-no-reshard")
FSDP1 = {"full-shard": "FULL_SHARD", "shard-grad-op": "SHARD_GRAD_OP"}
FSDP2 = {"fsdp2": True, "fsdp2-default": None, "fsdp2-no-reshard": False}  # reshard_after_forward per strategy


@dataclass(frozen=True)
class Op:
    """One collective of a step: kind, payload elements, and whether backward issues it."""

    op: str  # all_reduce | all_gather | reduce_scatter
    numel: int
    backward: bool
    unit: str = ""
    group: int | None = None  # ranks of this collective's group, when not the step's world size

    def ranks(self, world_size: int) -> int:
        return self.group if self.group is not None else world_size


@dataclass(frozen=True)
class Volume:
    """A step's collectives, counted."""

    ops: tuple[Op, ...]
    element_bytes: int
    world_size: int

    @property
    def logical(self) -> int:
        return sum(o.numel for o in self.ops) * self.element_bytes

    @property
    def ring(self) -> Fraction:
        return sum(
            (ring_bytes(o.op, o.numel * self.element_bytes, o.ranks(self.world_size)) for o in self.ops), Fraction(0)
        )

    def by_op(self) -> dict[str, dict[str, int]]:
        """{op: {"count", "numel"}}, in first-seen order."""
        out: dict[str, dict[str, int]] = {}
        for o in self.ops:
            entry = out.setdefault(o.op, {"count": 0, "numel": 0})
            entry["count"] += 1
            entry["numel"] += o.numel
        return out

    def counts(self) -> dict[str, dict[str, int]]:
        """{"forward"|"backward": {op: count}}."""
        out: dict[str, dict[str, int]] = {"forward": {}, "backward": {}}
        for o in self.ops:
            phase = out["backward" if o.backward else "forward"]
            phase[o.op] = phase.get(o.op, 0) + 1
        return out


def freed_after_forward(strategy: str, units: Iterable[str], root: str) -> set[str]:
    """The units whose unsharded parameters forward frees, so backward all-gathers them again."""
    units = list(units)
    if strategy in ("full-shard", "fsdp2-default"):
        return {u for u in units if u != root}
    if strategy == "fsdp2":
        return set(units)
    if strategy in ("shard-grad-op", "fsdp2-no-reshard"):
        return set()
    raise ValueError(f"{strategy!r} does not shard; one of {', '.join(STRATEGIES[1:])}")


def with_parameters(
    unit_shapes: Mapping[str, Sequence[tuple[int, ...]]], root: str, backward_order: Sequence[str] | None
) -> tuple[list[str], list[str]]:
    """The units that issue collectives (those given at least one parameter), in registration order, and the
    backward order over them (default: the reverse). ``root`` must be one of ``unit_shapes`` (an empty list when
    it holds no parameter of its own), and ``backward_order`` may name only units given."""
    if root not in unit_shapes:
        raise ValueError(
            f"the root {root!r} is not among the units {list(unit_shapes)}: give it an empty shape list when it "
            "holds no parameter of its own"
        )
    units = [u for u, shapes in unit_shapes.items() if len(shapes) > 0]
    if backward_order is None:
        return units, list(reversed(units))
    if unknown := [u for u in backward_order if u not in unit_shapes]:
        raise ValueError(f"backward_order names units not given: {unknown}")
    return units, [u for u in backward_order if u in units]


def sharded_step(
    padded: Mapping[str, int],
    freed: set[str],
    element_bytes: int,
    world_size: int,
    backward_order: Sequence[str] | None = None,
) -> Volume:
    """A sharded strategy's step: forward all-gathers every unit in ``padded`` order; backward, in
    ``backward_order`` (default: the reverse), all-gathers each freed unit and reduce-scatters every unit."""
    backward_order = list(backward_order) if backward_order is not None else list(reversed(list(padded)))
    forward = [Op("all_gather", padded[u], False, u) for u in padded]
    backward = [Op("all_gather", padded[u], True, u) for u in backward_order if u in freed]
    backward += [Op("reduce_scatter", padded[u], True, u) for u in backward_order]
    return Volume((*forward, *backward), element_bytes, world_size)


def ddp_step(numel: int, element_bytes: int, world_size: int, buckets: Sequence[int] | None = None) -> Volume:
    """DDP's step: one all-reduce per bucket, ``buckets`` (elements) summing to ``numel`` (one bucket if None)."""
    buckets = list(buckets) if buckets is not None else [numel]
    if sum(buckets) != numel:
        raise ValueError(f"buckets {buckets} do not add up to the {numel} gradient elements")
    return Volume(tuple(Op("all_reduce", b, True) for b in buckets), element_bytes, world_size)


def fsdp1_padded(unit_numels: Mapping[str, Sequence[int]], element_bytes: int, world_size: int,
                 use_orig_params: bool = True) -> dict[str, int]:  # fmt: skip
    """Each FSDP1 unit's padded unsharded flat-parameter size (`checks.models.flat_param`)."""
    return {u: padded_numel(n, element_bytes, world_size, align=use_orig_params) for u, n in unit_numels.items()}


def fsdp2_padded(unit_shapes: Mapping[str, Sequence[tuple[int, ...]]], world_size: int) -> dict[str, int]:
    """Each FSDP2 unit's all-gather output: every parameter's dim 0 padded to a multiple of N
    (`checks.models.fsdp2_shards`), concatenated."""
    return {u: sum(padded_shard_numel(s, world_size) for s in shapes) * world_size for u, shapes in unit_shapes.items()}


def step(
    strategy: str,
    unit_shapes: Mapping[str, Sequence[tuple[int, ...]]],
    world_size: int,
    *,
    root: str,
    backward_order: Sequence[str] | None = None,
    element_bytes: int = 4,
    use_orig_params: bool = True,
) -> Volume:
    """One step of ``strategy`` over units given as parameter shapes (registration order, root first)."""
    units, order = with_parameters(unit_shapes, root, backward_order)
    numels = {u: [_numel(s) for s in unit_shapes[u]] for u in units}
    if strategy == "ddp":
        return ddp_step(sum(sum(n) for n in numels.values()), element_bytes, world_size)
    if strategy in FSDP1:
        padded = fsdp1_padded(numels, element_bytes, world_size, use_orig_params)
    elif strategy in FSDP2:
        padded = fsdp2_padded({u: unit_shapes[u] for u in units}, world_size)
    else:
        raise ValueError(f"unknown strategy {strategy!r}; one of {', '.join(STRATEGIES)}")
    freed = freed_after_forward(strategy, padded, root)
    return sharded_step(padded, freed, element_bytes, world_size, order)


def fsdp2_step(
    unit_shapes: Mapping[str, Sequence[tuple[int, ...]]],
    world_size: int,
    reshard_after_forward: Setting | Mapping[str, Setting],
    *,
    root: str,
    backward_order: Sequence[str] | None = None,
    element_bytes: int = 4,
) -> Volume:
    """One FSDP2 step with a ``reshard_after_forward`` for every unit, or one per unit (a mapping naming each):
    forward all-gathers every unit over all N ranks; backward all-gathers again each unit its post-forward
    resharded, over the ranks it was resharded to (N for True, k for an int k, guide 18's
    `checks.models.fsdp2_reshard.post_forward_world_size`), and reduce-scatters every unit over N."""
    settings = per_unit(reshard_after_forward, unit_shapes)
    units, order = with_parameters(unit_shapes, root, backward_order)
    padded = fsdp2_padded({u: unit_shapes[u] for u in units}, world_size)
    after = {u: post_forward_world_size(settings[u], world_size, is_root=u == root) for u in padded}
    forward = [Op("all_gather", padded[u], False, u) for u in padded]
    smaller = {u: k if k != world_size else None for u, k in after.items()}  # None: the step's world
    backward = [Op("all_gather", padded[u], True, u, smaller[u]) for u in order if after[u] is not None]
    backward += [Op("reduce_scatter", padded[u], True, u) for u in order]
    return Volume((*forward, *backward), element_bytes, world_size)


# Strategies whose steps inside ``no_sync()`` are modelled (guide 10 reads FSDP1's and DDP's).
ACCUMULATING = ("ddp", "full-shard", "shard-grad-op")


def accumulation_steps(
    strategy: str,
    unit_shapes: Mapping[str, Sequence[tuple[int, ...]]],
    world_size: int,
    syncs: Sequence[bool],
    *,
    root: str,
    backward_order: Sequence[str] | None = None,
    element_bytes: int = 4,
    use_orig_params: bool = True,
) -> list[Volume]:
    """One `Volume` per step of a run whose step i synchronises gradients when ``syncs[i]`` and runs inside
    ``no_sync()`` otherwise, from sharded parameters (a fresh model, or the step after a synced one):

    - DDP all-reduces its buckets in a synced step only: inside ``no_sync`` it communicates nothing;
    - FSDP1 reduce-scatters every unit in a synced step only. FULL_SHARD frees each unit after its backward
      whether it syncs or not (``_should_free_in_backward``, guide 10), so every step gathers as a synced one.
      SHARD_GRAD_OP, inside ``no_sync``, keeps every unit unsharded after backward: the next steps all-gather
      nothing, until a synced step reduces and frees them.

    Other strategies raise: their ``no_sync`` steps are not modelled here."""
    if strategy not in ACCUMULATING:
        raise ValueError(
            f"steps inside no_sync are modelled for {', '.join(ACCUMULATING)}, not {strategy!r} (FSDP2's "
            "set_requires_gradient_sync is not)"
        )
    units, order = with_parameters(unit_shapes, root, backward_order)
    numels = {u: [_numel(s) for s in unit_shapes[u]] for u in units}
    if strategy == "ddp":
        full = ddp_step(sum(sum(n) for n in numels.values()), element_bytes, world_size)
        return [full if sync else Volume((), element_bytes, world_size) for sync in syncs]
    padded = fsdp1_padded(numels, element_bytes, world_size, use_orig_params)
    freed_forward = freed_after_forward(strategy, padded, root)
    unsharded: set[str] = set()  # units holding their unsharded parameters when a step starts
    out = []
    for sync in syncs:
        forward = [Op("all_gather", padded[u], False, u) for u in padded if u not in unsharded]
        backward = [Op("all_gather", padded[u], True, u) for u in order if u in freed_forward]
        if sync:
            backward += [Op("reduce_scatter", padded[u], True, u) for u in order]
        out.append(Volume((*forward, *backward), element_bytes, world_size))
        unsharded = set(padded) if strategy == "shard-grad-op" and not sync else set()
    return out


def gloo_step(volume: Volume) -> Volume:
    """The same step as gloo runs it: every reduce-scatter an all-reduce of its whole input."""
    ops = tuple(Op("all_reduce", o.numel, o.backward, o.unit) if o.op == "reduce_scatter" else o for o in volume.ops)
    return Volume(ops, volume.element_bytes, volume.world_size)


def ratio(volume: Volume, ddp: Volume) -> Fraction:
    """Ring-model bytes of a step against DDP's."""
    return volume.ring / ddp.ring


def textbook_ratio(strategy: str, theta: int, root: int) -> Fraction:
    """The closed form of the table above, without padding: |θ| the parameters, |root| the root unit's."""
    if strategy in ("ddp", "shard-grad-op", "fsdp2-no-reshard"):
        return Fraction(1)
    if strategy == "fsdp2":
        return Fraction(3, 2)
    if strategy in ("full-shard", "fsdp2-default"):
        return Fraction(3 * theta - root, 2 * theta)
    raise ValueError(f"unknown strategy {strategy!r}")


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out
