"""What FSDP2's ``reshard_after_forward`` does to one step, per unit: where each unit is resharded to, the
all-gathers it costs, and the bytes it keeps between forward and backward (guide 18). Torch-free.

The rule, as guide 18 reads it in ``_get_post_forward_mesh_info`` and ``FSDPState._lazy_init`` (torch 2.13):

1. ``None`` (the default) is treated as ``True`` by ``fully_shard``; the root's lazy init then drops the root's
   post-forward mesh, so the root is kept unsharded after forward and every other unit is resharded.
2. ``True`` reshards to the full shard world size N; ``False`` keeps the unit unsharded.
3. An int k must divide N and lie in 1..N (``ValueError`` otherwise). k = 1 becomes ``False`` with a logged
   warning; k = N becomes ``True`` silently; any other k reshards to k ranks (a (N/k)×k mesh, ``Shard(0)`` over
   its rows of k ranks). An explicit value, int or bool, applies to the root too.

A unit resharded to N is all-gathered again in backward over N ranks; one resharded to k < N keeps its slice of
the all-gather output, P/k elements, and is all-gathered in backward over its k ranks, the output again P; one
kept unsharded keeps all P and is not all-gathered again. Forward all-gathers every unit over N; backward
reduce-scatters every unit over N. P is a unit's padded unsharded size (every dim 0 padded to a multiple of N,
`checks.models.fsdp2_shards`).

`unsharded_peak` walks a step's event sequence (guide 17's rule model) for the most unsharded bytes alive at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction

from checks.models.ring import ring_bytes

Setting = bool | int | None


def resolve(setting: Setting, world_size: int) -> tuple[bool | int, bool]:
    """``fully_shard``'s reading of an explicit ``setting`` on a mesh of N = ``world_size`` (rule 3): the
    effective value (``True``, ``False`` or an int 1 < k < N) and whether a warning is logged. ``None`` is read as
    ``True`` here; the root's exception is `post_forward_world_size`'s."""
    if setting is None or isinstance(setting, bool):
        return (True if setting is None else setting), False
    if setting < 1 or setting > world_size or world_size % setting != 0:
        raise ValueError(f"an int reshard_after_forward must be a factor of {world_size}, not {setting}")
    if setting == 1:
        return False, True
    if setting == world_size:
        return True, False
    return setting, False


def per_unit(settings: Setting | Mapping[str, Setting], units: Iterable[str]) -> dict[str, Setting]:
    """Each unit's own setting: one ``setting`` for all, or a mapping that names every unit (as ``fully_shard``
    takes it, one call per unit) and no other; a unit left out or one not in ``units`` is refused."""
    units = list(units)
    if not isinstance(settings, Mapping):
        return dict.fromkeys(units, settings)
    if missing := [u for u in units if u not in settings]:
        raise ValueError(f"reshard_after_forward names no setting for {missing}")
    if extra := [u for u in settings if u not in units]:
        raise ValueError(f"reshard_after_forward names unknown units {extra}")
    return {u: settings[u] for u in units}


def post_forward_world_size(setting: Setting, world_size: int, *, is_root: bool) -> int | None:
    """Ranks a unit is resharded to after forward: N (fully), k (an int), or None (kept unsharded)."""
    if setting is None and is_root:
        return None
    effective, _ = resolve(setting, world_size)
    if effective is True:
        return world_size
    if effective is False:
        return None
    return int(effective)


def all_gathers(units: Sequence[str], root: str, setting: Setting, world_size: int) -> dict[str, list[tuple[str, int]]]:
    """(unit, group size) of each all-gather: forward in ``units`` order (the root first), backward in reverse
    post-forward order (the root first, then the inner units from the last), only the units resharded."""
    inner = [u for u in units if u != root]
    forward = [(u, world_size) for u in [root, *inner]]
    backward = []
    for unit in [root, *reversed(inner)]:
        size = post_forward_world_size(setting, world_size, is_root=unit == root)
        if size is not None:
            backward.append((unit, size))
    return {"forward": forward, "backward": backward}


def held_after_forward(
    padded: Mapping[str, int], root: str, setting: Setting, world_size: int, element_bytes: int
) -> int:
    """Bytes of unsharded or post-forward-resharded parameters a rank holds between forward and backward, beyond
    its sharded parameters: P for a unit kept unsharded, P/k for one resharded to k < N, 0 for one resharded."""
    held = Fraction(0)
    for unit, numel in padded.items():
        size = post_forward_world_size(setting, world_size, is_root=unit == root)
        if size is None:
            held += numel
        elif size < world_size:
            held += Fraction(numel, size)
    if held.denominator != 1:
        raise ValueError(f"{dict(padded)} does not split evenly into post-forward shards")
    return int(held) * element_bytes


def ring_step_bytes(
    padded: Mapping[str, int], root: str, setting: Setting, world_size: int, element_bytes: int
) -> dict[str, Fraction]:
    """Ring-model bytes one rank sends in one step, forward and backward (all-gathers over their group, the
    reduce-scatters over N)."""
    order = all_gathers(list(padded), root, setting, world_size)
    forward = sum((ring_bytes("all_gather", padded[u] * element_bytes, n) for u, n in order["forward"]), Fraction())
    backward = sum((ring_bytes("all_gather", padded[u] * element_bytes, n) for u, n in order["backward"]), Fraction())
    backward += sum((ring_bytes("reduce_scatter", p * element_bytes, world_size) for p in padded.values()), Fraction())
    return {"forward": forward, "backward": backward, "step": forward + backward}


def unsharded_peak(sequence: Sequence[str], padded: Mapping[str, int], element_bytes: int) -> int:
    """The most bytes of unsharded parameters alive at once over a step, walking guide 17's event sequence
    (`checks.models.fsdp2_prefetch.step_sequence`): a unit's unsharded parameters exist from its copy-out
    (``wait_unshard U``) to its ``free U``. All-gather buffers and post-forward shards are not counted."""
    alive: set[str] = set()
    peak = 0
    for event in sequence:
        kind, _, unit = event.partition(" ")
        if kind == "wait_unshard":
            alive.add(unit)
        elif kind in ("free", "reshard"):  # a reshard to a post-forward mesh drops the unsharded parameters too
            alive.discard(unit)
        peak = max(peak, sum(padded[u] for u in alive))
    return peak * element_bytes


def repeated_use_step(uses: Sequence[str], root: str, setting: Setting) -> dict[str, list[str]]:
    """All-gathers and reduce-scatters of one step whose inner units run in ``uses`` order, a unit possibly more
    than once, under a setting that reshards every inner unit after forward (True or None): each use's
    post-forward reshards, so every use all-gathers in forward; in backward each use's pre-backward finds the
    unit resharded by the post-backward of its later use, so every use all-gathers again (the root only if it
    was resharded). Autograd sums a parameter's gradient over its uses before it stores it, so only a unit's last
    post-backward (its first use) finds a gradient: one reduce-scatter per unit, the root's last."""
    if post_forward_world_size(setting, 2, is_root=False) is None:
        raise ValueError(f"{setting!r} keeps inner units unsharded; this rule is for True and None")
    forward = [root, *uses]
    backward = ([root] if setting is not None else []) + list(reversed(uses))
    reduced = [u for i, u in enumerate(reversed(uses)) if u not in list(reversed(uses))[i + 1 :]] + [root]
    return {"forward": forward, "backward": backward, "reduce_scatter": reduced}
