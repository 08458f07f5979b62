"""Checks for guide 01, the step map: every FSDP1 hook of one training step, in order."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from checks.expected import Expected
from checks.probes.comm import record_comm
from checks.probes.events import record_events
from checks.probes.timeline import lines
from checks.ranks import marks
from checks.ranks.context import RankContext
from checks.violation import require
from checks.workloads.gpt import batch, fsdp1_gpt, units

RU = "torch.distributed.fsdp._runtime_utils"
FORWARD_REGISTRATION = (  # the hook registration helpers FSDP1's wrapper does not use
    f"{RU}:_register_pre_forward_hook",
    f"{RU}:_register_post_forward_hook",
    f"{RU}:_register_root_pre_forward_hook",
)
FORWARD_DIRECT = (f"{RU}:_root_pre_forward", f"{RU}:_pre_forward", f"{RU}:_post_forward")


def one_step_timeline(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """One forward and backward of the default wrap (FULL_SHARD, BACKWARD_PRE) matches the guide's timeline.
    Returns the timeline, how many of its unshards all-gathered, and whose post-backward hook ran last."""
    model = fsdp1_gpt(ctx)
    x, y = batch(ctx)
    with record_events(model) as events:
        _, loss = model(x, y)
        loss.backward()
    observed = lines(events)
    expected.require_rows(observed, reason="timeline-differs", what=f"rank {ctx.rank}'s step timeline")
    post_backward = [line.split()[1] for line in observed if line.endswith("post-backward hook")]
    return {
        "timeline": observed,
        "all_gathers": sum(line.endswith("(all-gather)") for line in observed),
        "last_post_backward": post_backward[-1],
    }


def same_on_every_rank(ctx: RankContext) -> int:
    """Every rank records the same events and issues the same collectives, in the same order, though the rows
    each rank's root computes on differ."""
    model = fsdp1_gpt(ctx)
    x, y = batch(ctx)  # different rows on each rank: the schedule must not depend on the data
    rows: list[int] = []

    def note_rows(module: torch.nn.Module, args: tuple) -> None:
        rows.append(hash(tuple(args[0].flatten().tolist())))  # what the root's own compute receives

    hook = model._fsdp_wrapped_module.register_forward_pre_hook(note_rows)
    with record_comm() as comm, record_events(model) as events:
        _, loss = model(x, y)
        loss.backward()
    hook.remove()
    require(len(events) > 0 and len(comm) > 0, "nothing-recorded", "nothing was recorded")
    ctx.assert_same_on_all_ranks(events.keys(), "the FSDP event sequence")
    ctx.assert_same_on_all_ranks(comm.keys(), "the collective sequence")
    inputs = ctx.gather(rows)
    repeats = [rank for rank, seen in enumerate(inputs) if seen in inputs[:rank]]
    message = f"ranks {repeats} computed on the same rows as a lower rank: the schedule was not tested on other data"
    require(not repeats, "same-data-on-ranks", message, repeats=repeats)
    return len(events)


def forward_hooks_are_calls_not_hooks(ctx: RankContext, torch_root: str | None = None) -> list[str]:
    """The wrapper's forward calls the runtime functions itself; the forward registration helpers never run,
    no FSDP unit carries a forward hook, and nothing in the installed torch calls those helpers."""
    with marks.watch(FORWARD_REGISTRATION + FORWARD_DIRECT) as seen:
        model = fsdp1_gpt(ctx)
        x, y = batch(ctx)
        _, loss = model(x, y)
        loss.backward()
    ran = sorted(s.split(":")[1] for s in seen & set(FORWARD_REGISTRATION))
    require(not ran, "registration-ran", f"forward hook registration ran: {ran}", ran=ran)
    missing = sorted(s.split(":")[1] for s in set(FORWARD_DIRECT) - seen)
    require(not missing, "direct-call-missing", f"the wrapper's forward did not call {missing}", missing=missing)
    hooked = [
        name
        for name, module in units(model).items()
        if module._forward_pre_hooks or module._forward_hooks or module._fsdp_wrapped_module._forward_pre_hooks
    ]
    require(not hooked, "unit-has-forward-hook", f"FSDP units with forward hooks: {hooked}", hooked=hooked)
    # The source scan is the same on every rank: rank 0 does it.
    names = [s.split(":")[1] for s in FORWARD_REGISTRATION]
    callers = _callers(Path(torch_root or Path(torch.__file__).parent), names) if ctx.rank == 0 else []
    message = "the installed torch calls the forward registration helpers:\n" + "\n".join(callers)
    require(not callers, "registration-has-callers", message, callers=callers)
    return [s.split(":")[1] for s in FORWARD_DIRECT]


def _callers(root: Path, names: list[str]) -> list[str]:
    """``file:line`` of every call of ``names`` in torch's Python files (definitions excluded)."""
    call = re.compile(r"(?<![\w.])(?:\w+\.)*(" + "|".join(map(re.escape, names)) + r")\s*\(")
    found = []
    for path in root.rglob("*.py"):
        text = path.read_text(errors="replace")
        if not any(name in text for name in names):
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if call.search(line) and not line.lstrip().startswith("def "):
                found.append(f"{path.relative_to(root.parent)}:{number}: {line.strip()}")
    return found


def _hooks_on_node(hooks_dict_ref: Any) -> int:
    """FSDP post-backward hooks registered on the AccumulateGrad node whose hook dict ``hooks_dict_ref`` (a weak
    reference, so the check does not keep the node alive) points to; 0 once the node is gone."""
    hooks = hooks_dict_ref() if hooks_dict_ref is not None else None
    return sum(
        getattr(getattr(h, "func", None), "__name__", "") == "_post_backward_hook" for h in (hooks or {}).values()
    )


def post_backward_hook_lives_one_iteration(ctx: RankContext) -> dict[str, list[bool]]:
    """Each flat parameter's AccumulateGrad hook is registered by its first forward of an iteration and removed
    by the final callback, so every iteration registers it again. Iteration 2 runs two forwards before its
    backward: the second keeps the first's hook. Besides ``_post_backward_hook_state``, the check counts the FSDP
    hooks on each AccumulateGrad node: one after a forward, none after the backward (removed, not only
    forgotten)."""
    model = fsdp1_gpt(ctx)
    flat_params = {name: unit._handle.flat_param for name, unit in units(model).items()}
    x, y = batch(ctx)
    seen: dict[str, list[bool]] = {}
    nodes: dict[str, Any] = {}  # each flat parameter's node's hook dict, by weak reference

    def expect(moment: str, registered: bool, first: dict[str, Any] | None = None) -> dict[str, Any]:
        seen[moment] = [hasattr(fp, "_post_backward_hook_state") for fp in flat_params.values()]
        wanted = [registered] * len(flat_params)
        message = f"{moment}: post-backward hook registered on {list(flat_params)} = {seen[moment]}, expected {wanted}"
        require(seen[moment] == wanted, "hook-lifetime", message, moment=moment, observed=seen[moment])
        states = {name: getattr(fp, "_post_backward_hook_state", None) for name, fp in flat_params.items()}
        if registered:
            nodes.update({name: state[-1].hooks_dict_ref for name, state in states.items()})
        counts = [_hooks_on_node(nodes.get(name)) for name in flat_params]
        reason = "hook-not-from-first-forward" if registered else "hook-not-removed"
        message = (
            f"{moment}: FSDP hooks on each AccumulateGrad node {counts}, expected {[int(registered)] * len(counts)}"
        )
        require(counts == [int(registered)] * len(counts), reason, message, moment=moment, observed=counts)
        if first is not None:
            kept = [states[name] is first[name] for name in flat_params]
            message = f"{moment}: the hook state is the iteration's first forward's on {kept}"
            require(all(kept), "hook-not-from-first-forward", message, moment=moment, observed=kept)
        return states

    expect("constructed", registered=False)
    _, loss = model(x, y)
    expect("after forward 1", registered=True)
    loss.backward()
    expect("after backward 1", registered=False)
    # Iteration 2: two forwards, one backward of both.
    _, loss = model(x, y)
    first = expect("after forward 1 of iteration 2", registered=True)
    _, again = model(x, y)
    expect("after forward 2 of iteration 2", registered=True, first=first)
    (loss + again).backward()
    expect("after backward 2", registered=False)
    return seen


# -- break-it recipes: this guide's behaviour bent on purpose (tests/break_it/ applies them) --------------


def reshard_twice_on_rank_1(original: Any, state: Any, handle: Any) -> None:
    """``_post_forward_reshard`` that, on rank 1 only, first keeps and then frees: the ranks' event sequences
    differ while their collectives still match (a divergence that changes collectives would deadlock instead)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import _runtime_utils

    if handle and dist.get_rank() == 1:
        _runtime_utils._reshard(state, handle, False)
    original(state, handle)


def forward_registering_hooks(original: Any, module: Any, *args: Any, keep: bool = False, **kwargs: Any) -> Any:
    """``FullyShardedDataParallel.forward`` that first calls the composable-path helper
    ``_register_pre_forward_hook`` (and removes the hook again unless ``keep``)."""
    from torch.distributed.fsdp import _runtime_utils

    _runtime_utils._register_pre_forward_hook(module, module)
    if not keep:
        for handle in module._pre_forward_handles:
            handle.remove()
        module._pre_forward_handles.clear()
    return original(module, *args, **kwargs)


def finalize_keeping_hook_state(original: Any, state: Any) -> None:
    """``_finalize_params`` that removes the hook but leaves ``_post_backward_hook_state`` behind."""
    handle = state._handle
    kept = getattr(handle.flat_param, "_post_backward_hook_state", None) if handle else None
    original(state)
    if kept is not None:
        handle.flat_param._post_backward_hook_state = kept


class _Unremovable:
    """A hook handle whose ``remove`` does nothing."""

    def remove(self) -> None:
        pass


def finalize_without_removing_hook(original: Any, state: Any) -> None:
    """``_finalize_params`` that deletes ``_post_backward_hook_state`` as usual but never removes the hook: the
    tuple's handle is swapped for one whose ``remove`` does nothing."""
    flat_param = state._handle.flat_param if state._handle else None
    hook_state = getattr(flat_param, "_post_backward_hook_state", None)
    if hook_state is not None:
        flat_param._post_backward_hook_state = (*hook_state[:-1], _Unremovable())
    original(state)


def register_post_backward_hook_every_forward(original: Any, state: Any, handle: Any) -> None:
    """``_register_post_backward_hook`` that registers a new hook at every forward, not only the iteration's first:
    it forgets the attribute that says one is registered (the old hook stays on the node)."""
    if handle and hasattr(handle.flat_param, "_post_backward_hook_state"):
        delattr(handle.flat_param, "_post_backward_hook_state")
    original(state, handle)


def forward_on_rank_0s_rows(original: Any, module: Any, *args: Any, **kwargs: Any) -> Any:
    """``FullyShardedDataParallel.forward`` that first overwrites its integer inputs (token ids, targets) with rank
    0's: every rank then trains on the same rows, and the schedule is still the same on every rank."""
    import torch.distributed as dist

    for arg in args:
        if isinstance(arg, torch.Tensor) and not arg.is_floating_point():
            dist.broadcast(arg, src=0)
    return original(module, *args, **kwargs)
