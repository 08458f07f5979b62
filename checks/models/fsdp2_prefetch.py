"""Which FSDP2 group unshards ahead of time, as rules over unit names (guide 17). Torch-free.

One training step of ``fully_shard`` units, each with one parameter group: a root (outermost, its own layers
produce the output, its forward inputs need no gradient) and inner units run once each, in ``forward`` order.

A unit whose forward inputs need no gradient (the root, whose inputs are the model's; the first inner unit when
it takes the model's input directly, as the toy's ``0`` does) gets no post-backward from autograd: the final
callback runs it, for those units in module pre-order (the root first, then the inner units in ``forward`` order,
which the model takes to be module order).

A group is *sharded*, *in flight* (an all-gather issued, not yet waited for) or *unsharded*. An unshard of a
group that is not sharded issues nothing (``FSDPParamGroup.unshard`` returns early when a result is pending or
the group is unsharded). A wait of a group in flight copies out (``wait_unshard``); of any other group it does
nothing. A reshard of an unsharded group frees it (``free``).

Forward. The root's pre-forward unshards and waits for the root; each inner unit's pre-forward unshards and waits
for its own group, then (explicit targets only, ``forward_targets``) prefetches each target in the order given.
There is no implicit forward prefetch. Each post-forward reshards the group if ``reshard_after_forward`` says so
and appends it to the post-forward order; the root's post-forward comes last.

Backward. Pre-backward hooks run in reverse post-forward order. Each unshards and waits for its own group, then
prefetches: the explicit targets (``backward_targets``) in the order given if the unit has any; otherwise the
entry before its own in the post-forward order (implicit), none for the first. An inner unit's post-backward
(after its gradient) frees it and reduce-scatters; the root's, and those of ``no_input_grad``, run from the final
callback.

Several forwards. Each forward runs the root's pre-forward again, unshards each group it reaches (issuing nothing
for a group the last forward kept), and appends one post-forward entry per use, each group keeping a stack of
its indices. Each backward covers some forwards; autograd runs the one built last first, each in reverse
post-forward order. A pre-backward hook on a group already in pre-backward returns at once (explicit targets are
still prefetched: the state's hook runs them every time); otherwise it unshards, waits, and pops the group's
latest index for the implicit target. A post-backward always frees; it reduces only at the group's last use in
this backward, when autograd has accumulated the gradient (before that no parameter has one). The final callback
runs the post-backward of every group autograd did not reach, reducing those this backward used, and a last
backward (``is_last_backward``) clears every index, so a later backward prefetches nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from checks.models.fsdp2_reshard import Setting, per_unit, post_forward_world_size

RESHARD = (True, None, False)
FREE, KEEP, RESHARD_SMALLER = "free", "keep", "reshard"


def reshards_after_forward(unit: str, root: str, setting: bool | None) -> bool:
    """``reshard_after_forward`` as each unit applies it: ``None`` (the default) is True except for the root."""
    if setting not in RESHARD:
        raise ValueError(f"reshard_after_forward must be one of {RESHARD} here, not {setting!r}")
    return unit != root if setting is None else setting


def after_forward(unit: str, root: str, setting: Setting, world_size: int | None) -> str:
    """What ``unit``'s post-forward does with its unsharded parameters under its own ``setting``: ``free`` them
    (True, N, None but for the root), ``keep`` them (False, 1, None on the root), or ``reshard`` them to an int
    k < N ranks (``_to_sharded_post_forward``: a smaller shard is kept, the unsharded parameters go, and backward
    all-gathers from the k ranks). An int needs ``world_size``; the rule is guide 18's
    (`checks.models.fsdp2_reshard.post_forward_world_size`)."""
    if isinstance(setting, int) and not isinstance(setting, bool):
        if world_size is None:
            raise ValueError(f"{unit}: an int reshard_after_forward ({setting}) needs the world size")
    elif setting not in RESHARD:
        raise ValueError(f"{unit}: reshard_after_forward is a bool, an int or None, not {setting!r}")
    size = post_forward_world_size(setting, world_size or 1, is_root=unit == root)
    if size is None:
        return KEEP
    return FREE if world_size is None or size == world_size else RESHARD_SMALLER


def _backward_plan(
    forwards: int, backwards: Sequence[Sequence[int]] | None, last_backward: Sequence[bool] | None
) -> tuple[list[list[int]], list[bool]]:
    """Which forwards each ``.backward()`` covers, and whether it is the step's last (``is_last_backward``); every
    forward is backpropagated once, by exactly one backward."""
    if not isinstance(forwards, int) or isinstance(forwards, bool) or forwards < 1:
        raise ValueError(f"forwards is a positive int, not {forwards!r}")
    plan = [list(range(1, forwards + 1))] if backwards is None else [list(b) for b in backwards]
    covered = sorted(f for b in plan for f in b)
    if any(not b for b in plan) or covered != list(range(1, forwards + 1)):
        raise ValueError(
            f"backwards {plan} must cover forwards 1..{forwards} once each, every backward at least one: a forward "
            "left out, or backpropagated twice (retain_graph), is not modelled"
        )
    last = [True] * len(plan) if last_backward is None else list(last_backward)
    if len(last) != len(plan):
        raise ValueError(f"last_backward names {len(last)} backwards, backwards {len(plan)}")
    return plan, last


def step_sequence(
    forward: Sequence[str],
    root: str,
    *,
    reshard_after_forward: Setting | Mapping[str, Setting] = True,
    world_size: int | None = None,
    forward_targets: Mapping[str, Sequence[str]] | None = None,
    backward_targets: Mapping[str, Sequence[str]] | None = None,
    no_input_grad: Sequence[str] = (),
    root_params: bool = True,
    callback_state: str | None = None,
    forwards: int = 1,
    backwards: Sequence[Sequence[int]] | None = None,
    last_backward: Sequence[bool] | None = None,
    output_units: Sequence[str] = (),
) -> list[str]:
    """The step's events, as ``unshard U``, ``prefetch U→T``, ``wait_unshard U``, ``free U``, ``pre_backward U``,
    ``post_backward U``, ``reduce_grad U``, ``root_pre_forward R`` and ``final_callback R``, for inner units run
    in ``forward`` order under ``root`` (see the module docstring). All groups start sharded. ``no_input_grad``:
    inner units whose forward inputs need no gradient. ``reshard_after_forward`` is one setting for every unit or
    a mapping naming each unit's own (as ``fully_shard`` takes it per call); an int k < N reshards to k ranks
    after forward (``reshard U``; `after_forward`) and needs ``world_size``. ``root_params=False``: the root has
    no parameters of its own, so no parameter group: it still runs the root's pre-forward and queues the final
    callback, but never unshards, reshards, prefetches or reduces, and is not in the post-forward order.
    ``callback_state``: the state whose pre-backward hook runs first in each backward and so queues the final
    callback (``_register_root_post_backward_final_callback``, on whichever state calls it first). By default the
    root; a root without parameters that returns its last unit's output unchanged (an ``nn.Sequential``) is
    preceded by that unit, whose hook on the same tensor was registered first, so the default is then that unit.
    ``forwards``: whole forwards run before any backward; ``backwards``: the forwards (numbered from 1) each
    ``.backward()`` call covers, in call order (default: one backward over all); ``last_backward``: each one's
    ``is_last_backward`` (default True for all, torch's default). See "Several forwards" in the module docstring.
    ``output_units``: inner units whose output the root returns as it is (in post-forward order): their hooks on
    that tensor were registered before the root's, so their pre-backwards run before the root's."""
    forward_targets = forward_targets or {}
    backward_targets = backward_targets or {}
    units = [root, *forward] if root_params else list(forward)
    if len(set([root, *forward])) != len(forward) + 1:
        raise ValueError(f"each unit runs once per forward here: {[root, *forward]}")
    for targets in (forward_targets, backward_targets):
        for unit, wanted in targets.items():
            unknown = [u for u in (unit, *wanted) if u not in units]
            if unknown:
                where = "" if root_params else " (a root without parameters has no group to prefetch)"
                raise ValueError(f"unknown units {unknown}{where}")
    if unknown := [u for u in no_input_grad if u not in forward]:
        raise ValueError(f"unknown inner units {unknown}")
    if callback_state is not None and callback_state not in (root, *forward):
        raise ValueError(f"unknown callback state {callback_state!r}")
    plan, last = _backward_plan(forwards, backwards, last_backward)
    settings = per_unit(reshard_after_forward, units)
    actions = {u: after_forward(u, root, settings[u], world_size) for u in units}
    state = dict.fromkeys(units, "sharded")
    training = dict.fromkeys(units, "idle")  # FSDPParamGroup._training_state, as far as the hooks read it
    seq: list[str] = []

    def unshard(unit: str, issuer: str | None = None) -> None:
        if state[unit] == "sharded":
            state[unit] = "in flight"
            seq.append(f"unshard {unit}" if issuer is None else f"prefetch {issuer}→{unit}")

    def wait(unit: str) -> None:
        if state[unit] == "in flight":
            state[unit] = "unsharded"
            seq.append(f"wait_unshard {unit}")

    def free(unit: str) -> None:
        if state[unit] == "unsharded":
            state[unit] = "sharded"
            seq.append(f"free {unit}")

    def post_backward(unit: str, *, reduce: bool) -> None:
        seq.append(f"post_backward {unit}")
        free(unit)
        if reduce:  # else no parameter has a gradient yet: it returns before foreach_reduce
            seq.append(f"reduce_grad {unit}")
        training[unit] = "post_backward"

    post_forward: list[str] = []  # FSDPCommContext.post_forward_order: one entry per use
    indices: dict[str, list[int]] = {u: [] for u in units}  # each group's _post_forward_indices
    uses: list[list[str]] = []  # each forward's entries, in post-forward order

    def post_forward_of(unit: str) -> None:
        if actions[unit] == FREE:
            free(unit)
        elif actions[unit] == RESHARD_SMALLER and state[unit] == "unsharded":
            state[unit] = "sharded"  # sharded on the post-forward mesh: backward all-gathers it again
            seq.append(f"reshard {unit}")
        indices[unit].append(len(post_forward))
        post_forward.append(unit)
        uses[-1].append(unit)

    for _ in range(forwards):
        uses.append([])
        seq.append(f"root_pre_forward {root}")
        for unit in units:
            unshard(unit)
            wait(unit)
            for target in forward_targets.get(unit, ()):
                unshard(target, issuer=unit)
            if unit != root:
                post_forward_of(unit)
        if root_params:
            post_forward_of(root)

    from_autograd = {u for u in forward if u not in no_input_grad}  # the others' post-backward: final callback
    for covered, is_last in zip(plan, last, strict=True):
        # autograd runs the graph built last first: the latest forward's uses, each in reverse post-forward order
        walk = [unit for number in sorted(covered, reverse=True) for unit in reversed(uses[number - 1])]
        deferred: list[tuple[str, bool]] = []  # output units' post-backwards, run after the root's pre-backward
        first = [u for u in output_units if u in walk] if walk and walk[0] == root else []
        walk = [*first, *(u for u in walk if u not in first)]  # the output's first hooks are those units'
        last_use = {unit: i for i, unit in enumerate(walk)}
        for i, unit in enumerate(walk):
            explicit = backward_targets.get(unit, ())
            if training[unit] != "pre_backward":  # a second hook on a group already in pre-backward returns
                training[unit] = "pre_backward"
                seq.append(f"pre_backward {unit}")
                unshard(unit)
                wait(unit)
                if not explicit and indices[unit]:  # popped empty when a last backward cleared them
                    index = indices[unit].pop()
                    if index > 0:
                        unshard(post_forward[index - 1], issuer=unit)
            for target in explicit:  # the state's explicit targets, at every hook
                unshard(target, issuer=unit)
            if unit in first and unit in from_autograd:
                deferred.append((unit, last_use[unit] == i))
            elif unit in from_autograd:  # gradients accumulate only after the last use in this backward
                post_backward(unit, reduce=last_use[unit] == i)
            if unit == root:
                for waiting, reduce in reversed(deferred):
                    post_backward(waiting, reduce=reduce)
                deferred.clear()
        seq.append(f"final_callback {callback_state or (walk[0] if walk else root)}")
        for unit in units:
            if training[unit] != "post_backward":
                post_backward(unit, reduce=unit in last_use)
            training[unit] = "idle"
        if is_last:  # finalize_backward: indices cleared, an all-gather nobody waited for dropped
            post_forward.clear()
            for unit in units:
                indices[unit].clear()
                if state[unit] == "in flight":
                    state[unit] = "sharded"
    return seq


def prefetches(seq: Sequence[str], *, phase: str | None = None) -> list[str]:
    """The ``issuer→target`` prefetches of `step_sequence`'s ``seq``; ``phase`` ``"forward"`` or ``"backward"``
    keeps those before or after the first ``pre_backward``."""
    split = next((i for i, event in enumerate(seq) if event.startswith("pre_backward ")), len(seq))
    part = {"forward": seq[:split], "backward": seq[split:], None: seq}[phase]
    return [event.removeprefix("prefetch ") for event in part if event.startswith("prefetch ")]


def all_gathers(seq: Sequence[str]) -> dict[str, int]:
    """All-gathers of `step_sequence`'s ``seq`` (one per ``unshard`` or ``prefetch`` event: an event is recorded
    only when a group leaves the sharded state), split at the first ``pre_backward``."""
    split = next((i for i, event in enumerate(seq) if event.startswith("pre_backward ")), len(seq))

    def count(part: Sequence[str]) -> int:
        return sum(event.startswith(("unshard ", "prefetch ")) for event in part)

    return {"forward": count(seq[:split]), "backward": count(seq[split:])}


def all_gathers_by_formula(inner_units: int, reshard_after_forward: bool | None) -> dict[str, int]:
    """The count the guide derives: forward all-gathers every group once (n + 1); backward all-gathers again every
    group its forward resharded: all (True), all but the root (None), none (False). Prefetch moves all-gathers
    earlier; it never adds or removes one."""
    backward = {True: inner_units + 1, None: inner_units, False: 0}[reshard_after_forward]
    return {"forward": inner_units + 1, "backward": backward}


def lookahead(forward: Sequence[str], root: str, k: int, direction: str) -> dict[str, list[str]]:
    """Explicit targets with a lookahead of ``k``: in forward, each inner unit names the next ``k`` inner units; in
    backward, the root and each inner unit name the ``k`` units before it in post-forward order, nearest first
    (the first inner unit names none, which leaves it on the implicit path)."""
    if direction == "forward":
        return {u: list(forward[i + 1 : i + 1 + k]) for i, u in enumerate(forward)}
    if direction == "backward":
        order = [*forward, root]
        return {u: list(reversed(order[max(0, i - k) : i])) for i, u in enumerate(order) if i > 0}
    raise ValueError(f"direction is forward or backward, not {direction!r}")
