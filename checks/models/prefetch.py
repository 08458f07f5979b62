"""Which unit FSDP1 unshards ahead of time, as rules over unit names (guide 04 forward, guide 06 backward).

Forward (``forward_prefetch=True``, guide 04): iteration 1 records the order units run their pre-forward; from
then on, when unit U runs its pre-forward it prefetches the unit after U in the *recorded* order, unless that unit
already ran its pre-forward or was already prefetched this iteration.

Backward (from the post-forward order): pre-backward hooks fire in reverse post-forward order; a unit's
post-backward follows its own gradient computation, and the root's comes last when the root produces the
output. A prefetch targets the unit before the issuer in post-forward order, if that unit has not been unsharded
for backward yet: BACKWARD_PRE issues it from the pre-backward hook, BACKWARD_POST from the post-backward hook,
None never.

The candidate comes from the post-forward record (guide 06): every post-forward appends its unit, and a unit's
index is where it was first recorded, except that torch tests the index for truth, so the unit recorded at
index 0 takes a new index at its second use (`post_forward_record`). `backward_sequence_of_uses` follows that
record for a forward that may use a unit more than once; for distinct units it is `backward_sequence`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

POLICIES = ("BACKWARD_PRE", "BACKWARD_POST", None)


def forward_prefetches(recorded: Sequence[str], used: Sequence[str]) -> list[str]:
    """``issuer -> target`` for an iteration whose units run their pre-forward in ``used`` order, when the order
    recorded in iteration 1 was ``recorded``."""
    done: set[str] = set()
    prefetched: set[str] = set()
    out = []
    for current in used:
        done.add(current)
        position = list(recorded).index(current)
        if position + 1 < len(recorded):
            target = recorded[position + 1]
            if target not in done and target not in prefetched:
                prefetched.add(target)
                out.append(f"{current} -> {target}")
    return out


def backward_sequence(
    post_forward: Sequence[str],
    policy: str | None,
    *,
    root_params: bool = True,
    parents: Mapping[str, str] | None = None,
    output_units: Sequence[str] = (),
) -> list[str]:
    """The backward's hooks and prefetches, as ``pre_backward U``, ``post_backward U`` and ``prefetch U→T``,
    for units listed in post-forward order with the root (which produces the output) last. ``root_params=False``:
    the root holds no parameter of its own, so it has no handle, is not in ``post_forward`` (every entry is an inner
    unit, each with its own post-backward) and has no hook event.

    ``parents``: for a unit nested in another non-root unit, that unit (its nearest enclosing one). A unit's
    post-backward fires when autograd runs the node that gathers its views' gradients, created by its unshard at
    pre-forward: before anything of the units nested in it, so after all of them in backward (autograd runs the
    ready node created last first). Its post-backward therefore waits for theirs, as the root's waits for all.
    ``output_units``: inner units (in post-forward order) whose output the root returns as it is: their hooks on
    that tensor were registered before the root's, so their pre-backwards run first, and their post-backwards
    after the root's pre-backward."""
    if policy not in POLICIES:
        raise ValueError(f"unknown backward prefetch policy {policy!r}; one of {POLICIES}")
    if len(set(post_forward)) != len(post_forward):
        raise ValueError(f"a unit is used more than once in {list(post_forward)}: see backward_sequence_of_uses")
    parents = dict(parents or {})
    *inner, root = post_forward if root_params else [*post_forward, None]
    if unknown := [u for u in [*parents, *parents.values(), *output_units] if u not in inner]:
        raise ValueError(f"parents and output_units name inner units only, not {unknown}")
    done: set[str] = set()
    started: set[str] = set()
    nested_left = {unit: sum(parents.get(u) == unit for u in inner) for unit in inner}
    seq: list[str] = []

    def prefetch(issuer: str) -> None:
        i = post_forward.index(issuer)
        if i > 0 and post_forward[i - 1] not in done:
            done.add(post_forward[i - 1])
            seq.append(f"prefetch {issuer}→{post_forward[i - 1]}")

    def pre_backward(unit: str) -> None:
        seq.append(f"pre_backward {unit}")
        done.add(unit)
        started.add(unit)
        if policy == "BACKWARD_PRE":
            prefetch(unit)

    def post_backward(unit: str) -> None:
        if nested_left[unit] or unit not in started:
            return  # a unit nested in it has yet to finish, or its own backward has not begun
        seq.append(f"post_backward {unit}")
        if policy == "BACKWARD_POST":
            prefetch(unit)
        if (parent := parents.get(unit)) is not None:
            nested_left[parent] -= 1
            post_backward(parent)

    for unit in output_units:
        pre_backward(unit)
    if root is not None:
        pre_backward(root)
    for unit in reversed(output_units):
        post_backward(unit)
    for unit in reversed(inner):
        if unit not in started:
            pre_backward(unit)
            post_backward(unit)
    if root is not None:
        seq.append(f"post_backward {root}")
        if policy == "BACKWARD_POST":
            prefetch(root)
    return seq


def forward_sequence(root: str, inner: Sequence[str], strategy: str, *, root_params: bool = True) -> list[str]:
    """One forward's unshards and reshards: the root's pre-forward unshards the root; each inner unit is unsharded
    before and resharded after its forward; FULL_SHARD frees the inner units but keeps the root (it is needed first
    in backward); SHARD_GRAD_OP frees nothing. ``root_params=False``: a root without parameters of its own (no
    handle) runs its pre-forward and nothing else, and nothing is kept after forward: FULL_SHARD frees every unit."""
    if strategy not in ("FULL_SHARD", "SHARD_GRAD_OP"):
        raise ValueError(f"the forward is modelled for FULL_SHARD and SHARD_GRAD_OP, not {strategy!r}")
    keep_inner = strategy != "FULL_SHARD"
    seq = [f"root_pre_forward {root}", f"unshard {root}"] if root_params else [f"root_pre_forward {root}"]
    for unit in inner:
        seq += [f"unshard {unit}", f"{'reshard' if keep_inner else 'free'} {unit}"]
    return [*seq, f"reshard {root}"] if root_params else seq


def post_forward_record(uses: Sequence[str], *, zero_is_falsy: bool = True) -> tuple[list[str], dict[str, int]]:
    """What ``_ExecOrderData.record_post_forward`` leaves after post-forwards ran for ``uses``, in order, with
    nothing reset in between: the list (every use is appended, repeats included) and each unit's
    ``_post_forward_index``. Torch tests ``if handle._post_forward_index:``, so a unit at index 0 counts as not yet
    recorded and takes the index of its second use (``zero_is_falsy``); ``False`` models an ``is not None`` test,
    where every unit keeps the index of its first use."""
    record: list[str] = []
    index: dict[str, int] = {}
    for unit in uses:
        recorded = bool(index.get(unit)) if zero_is_falsy else unit in index
        if not recorded:
            index[unit] = len(record)
        record.append(unit)
    return record, index


def backward_sequence_of_uses(
    uses: Sequence[str], policy: str | None, *, zero_is_falsy: bool = True, root_params: bool = True
) -> list[str]:
    """`backward_sequence` for a forward whose post-forwards ran for ``uses`` (a unit may appear more than once; the
    root, which produces the output, once and last). Autograd reaches the uses in reverse: a unit's pre-backward
    hook runs at its last use only (later calls return at once), its post-backward after the gradient of its first
    use. A prefetch targets ``record[index[issuer] - 1]`` of `post_forward_record`, unless that unit's pre-backward
    already ran or it was already prefetched. ``root_params=False``: as in `backward_sequence`, ``uses`` are all
    inner units' and the root has no hook event."""
    if policy not in POLICIES:
        raise ValueError(f"unknown backward prefetch policy {policy!r}; one of {POLICIES}")
    *inner, root = uses if root_params else [*uses, None]
    if root is not None and root in inner:
        raise ValueError(f"the root {root!r} must be used once, last")
    record, index = post_forward_record(uses, zero_is_falsy=zero_is_falsy)
    first_use = {unit: inner.index(unit) for unit in inner}
    ran: set[str] = set()
    prefetched: set[str] = set()
    seq: list[str] = []

    def prefetch(issuer: str) -> None:
        i = index[issuer] - 1
        if i >= 0 and record[i] not in ran and record[i] not in prefetched:
            prefetched.add(record[i])
            seq.append(f"prefetch {issuer}→{record[i]}")

    def pre(unit: str) -> None:
        seq.append(f"pre_backward {unit}")
        ran.add(unit)
        if policy == "BACKWARD_PRE":
            prefetch(unit)

    def post(unit: str) -> None:
        seq.append(f"post_backward {unit}")
        if policy == "BACKWARD_POST":
            prefetch(unit)

    if root is not None:
        pre(root)
    for position in reversed(range(len(inner))):
        unit = inner[position]
        if unit not in ran:
            pre(unit)
        if position == first_use[unit]:
            post(unit)
    if root is not None:
        post(root)
    return seq
