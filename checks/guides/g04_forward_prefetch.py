"""Checks for guide 04, forward prefetch: the order recorded in iteration 1, followed from iteration 2 on."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import torch
from torch import nn

from checks.breakit.exercises import Exercise
from checks.breakit.patches import wrapping
from checks.models.prefetch import forward_prefetches as model_forward_prefetches
from checks.naming import ROOT
from checks.probes import EventLog, clock, record_events
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.gpt import batch, fsdp1_gpt, padded_sizes, units
from mini_gpt import GPT


class OrderedBlocks(nn.ModuleList):
    """Blocks iterated in ``order`` when it is set; their module names stay ``blocks.0``, ``blocks.1``, ..."""

    order: list[int] | None = None

    def __iter__(self) -> Iterator[nn.Module]:
        return iter([self[i] for i in self.order]) if self.order is not None else super().__iter__()


class ReorderableGPT(GPT):
    """mini_gpt whose forward runs its blocks in ``blocks.order``: a model whose forward order can change
    between iterations, which the static-graph assumption of forward prefetch does not expect."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.blocks = OrderedBlocks(self.blocks)


def forward_prefetches(events: EventLog, iteration: int) -> list[str]:
    """``issuer -> target`` of the prefetches issued from pre-forward (training state FORWARD)."""
    return [f"{e.unit} -> {e.target}" for e in events.select("prefetch", iteration=iteration) if e.state == "FORWARD"]


def compute_order(marks: dict[str, list[int]], iteration: int) -> list[str]:
    """Units in the order their own compute started in that iteration (one forward per iteration)."""
    return sorted(marks, key=lambda name: marks[name][iteration - 1])


def _compute_marks(model: nn.Module) -> dict[str, list[int]]:
    """Clock ticks taken when each unit's own module starts computing (a pre-hook on the wrapped module runs
    after FSDP's pre-forward, so it marks the start of compute)."""
    marks: dict[str, list[int]] = {}
    for name, fsdp_unit in units(model).items():

        def mark(module: nn.Module, args: object, name: str = name) -> None:
            marks.setdefault(name, []).append(clock.tick())

        fsdp_unit._fsdp_wrapped_module.register_forward_pre_hook(mark)
    return marks


def no_prefetch_in_iteration_1(ctx: RankContext) -> list[str]:
    model = fsdp1_gpt(ctx, forward_prefetch=True)
    x, y = batch(ctx)
    with record_events(model) as events:
        for _ in range(2):
            _, loss = model(x, y)
            loss.backward()
    first, second = forward_prefetches(events, 1), forward_prefetches(events, 2)
    require(first == [], "prefetched-in-iteration-1", f"iteration 1 prefetched in forward: {first}", observed=first)
    message = "iteration 2 did not prefetch in forward either: forward_prefetch is not active at all"
    require(second, "never-prefetched", message)
    return second


def follows_iteration_1_order(ctx: RankContext, stated: list[str]) -> list[str]:
    """From iteration 2, each unit's pre-forward prefetches the next unit of iteration 1's order (as the guide
    states it), before the issuing unit's own compute; prefetched units are then not unsharded again."""
    model = fsdp1_gpt(ctx, forward_prefetch=True)
    marks = _compute_marks(model)
    with record_events(model) as events:
        for step in range(3):
            _, loss = model(*batch(ctx, step=step))
            loss.backward()
    recorded = compute_order(marks, 1)
    expected = [f"{a} -> {b}" for a, b in pairwise(recorded)]
    stated_pairs = [" ".join(s.split()) for s in stated]
    what = f"the prefetches iteration 1's forward order {recorded} gives, against the guide's"
    require_equal(expected, stated_pairs, reason="order-differs-from-guide", what=what)
    for iteration in (2, 3):
        observed = forward_prefetches(events, iteration)
        require_equal(observed, expected, reason="prefetch-order", what=f"iteration {iteration}'s prefetches")
        for e in events.select("prefetch", iteration=iteration):
            if e.state != "FORWARD":
                continue
            compute = marks[e.unit][iteration - 1]
            message = f"iteration {iteration}: {e.unit}'s prefetch came after its compute started"
            require(e.seq < compute, "prefetch-after-compute", message, unit=e.unit, iteration=iteration)
        unsharded = [e.unit for e in events.select("unshard", iteration=iteration) if e.state == "FORWARD"]
        what = f"iteration {iteration}: units unsharded by their own pre-forward"
        require_equal(unsharded, [ROOT], reason="unsharded-again", what=what)
    return expected


def stale_order_after_change(ctx: RankContext) -> dict[str, list[str]]:
    """Reverse the blocks after iteration 1: iteration 2 still prefetches by iteration 1's order."""
    model = fsdp1_gpt(ctx, forward_prefetch=True, model_class=ReorderableGPT)
    marks = _compute_marks(model)
    inner = model._fsdp_wrapped_module
    x, y = batch(ctx)
    with record_events(model) as events:
        for order in ([0, 1, 2], [2, 1, 0]):
            inner.blocks.order = order
            _, loss = model(x, y)
            loss.backward()
    recorded, used = compute_order(marks, 1), compute_order(marks, 2)
    require_equal(used, [ROOT, "blocks.2", "blocks.1", "blocks.0"], reason="not-reversed", what="the reversed forward")
    observed = forward_prefetches(events, 2)
    static = model_forward_prefetches(recorded, used)
    dynamic = [f"{a} -> {b}" for a, b in pairwise(used)]
    require_equal(observed, static, reason="not-the-recorded-order", what="iteration 2's prefetches")
    message = f"iteration 2 followed its own new order {dynamic}: the order is not static"
    require(observed != dynamic, "followed-new-order", message, observed=observed)
    return {"recorded": recorded, "used": used, "prefetched": observed}


def _parse_held(stated: list[str]) -> dict[str, list[str]]:
    """``blocks.0: root blocks.0 blocks.1`` lines as {unit: units held}."""
    held = {}
    for line in stated:
        unit, _, rest = line.partition(":")
        held[unit.strip()] = rest.split()
    return held


def _storage_snapshots(model: nn.Module) -> dict[str, dict[str, int]]:
    """Bytes held by every unit's padded unsharded buffer, taken when each unit's own compute starts (a pre-hook
    on the wrapped module, which runs after FSDP's pre-forward); a later forward overwrites the earlier one's."""
    seen: dict[str, dict[str, int]] = {}
    all_units = units(model)
    for name, fsdp_unit in all_units.items():

        def snapshot(module: nn.Module, args: object, name: str = name) -> None:
            seen[name] = {
                n: u._handle.flat_param._full_param_padded.untyped_storage().nbytes() for n, u in all_units.items()
            }

        fsdp_unit._fsdp_wrapped_module.register_forward_pre_hook(snapshot)
    return seen


def held_at_compute(ctx: RankContext, with_prefetch: list[str], without_prefetch: list[str]) -> dict[str, Any]:
    """In iteration 2, which units' unsharded parameters are allocated when each unit's own compute starts, with
    and without forward prefetch; each allocated one holds its whole padded size (from the layout model)."""
    full = {name: 4 * numel for name, numel in padded_sizes(ctx.world_size, element_bytes=4).items()}
    observed = {}
    for label, forward_prefetch, stated in (("with", True, with_prefetch), ("without", False, without_prefetch)):
        model = fsdp1_gpt(ctx, forward_prefetch=forward_prefetch)
        seen = _storage_snapshots(model)
        for step in range(2):  # iteration 2's snapshots replace iteration 1's
            _, loss = model(*batch(ctx, step=step))
            loss.backward()
        held = {unit: [n for n, nbytes in sizes.items() if nbytes] for unit, sizes in seen.items()}
        partial = {f"{unit}: {n}": nbytes for unit, sizes in seen.items() for n, nbytes in sizes.items()
                   if nbytes not in (0, full[n])}  # fmt: skip
        require(not partial, "partial-storage", f"storage neither freed nor whole: {partial}", observed=partial)
        what = f"units allocated at each unit's compute start, iteration 2, {label} forward prefetch"
        require_equal(held, _parse_held(stated), reason="held-differs", what=what, prefetch=label)
        observed[label] = held
    return observed


def prefetch_without_backward(ctx: RankContext, stated: list[str], forwards: int = 3) -> list[list[str]]:
    """With no backward at all (evaluation under no_grad) the first forward prefetches nothing and every later
    forward prefetches by the order the first one recorded: the record is complete after one forward, although
    ``next_iter`` never runs."""
    model = fsdp1_gpt(ctx, forward_prefetch=True)
    model.eval()
    expected_pairs = [" ".join(s.split()) for s in stated]
    observed = []
    with torch.no_grad():
        for i in range(forwards):
            with record_events(model) as events:
                model(batch(ctx, step=i)[0])
            prefetches = forward_prefetches(events, 1)  # no final callback ran: everything is iteration 1
            expected = [] if i == 0 else expected_pairs
            what = f"forward {i + 1}'s prefetches with no backward"
            require_equal(prefetches, expected, reason="prefetch-order", what=what, forward=i + 1)
            observed.append(prefetches)
    return observed


# -- break-it recipes: this guide's behaviour bent on purpose (tests/break_it/ applies them) --------------


def forward_target_by_module_order(original: Any, eod: Any, current_handle: Any) -> Any:
    """``get_handle_to_forward_prefetch`` that falls back to the next handle in module order when the recorded
    order has none: a policy that could prefetch in iteration 1."""
    found = original(eod, current_handle)
    if found is None and current_handle._handle_index is not None:
        following = eod.all_handles[current_handle._handle_index + 1 :]
        return following[0] if following else None
    return found


def next_iter_forgetting_order(original: Any, eod: Any) -> None:
    """``next_iter`` that also forgets the recorded pre-forward order, so every iteration records afresh."""
    original(eod)
    for handle in eod.handles_pre_forward_order:
        handle._pre_forward_order_index = None
    eod.handles_pre_forward_order.clear()
    eod._iter = 0


def prefetch_two_ahead(original: Any, eod: Any, current_handle: Any) -> Any:
    """``get_handle_to_forward_prefetch`` with a limit of 2: the unit after next."""
    eod._forward_prefetch_limit = 2
    try:
        return original(eod, current_handle)
    finally:
        eod._forward_prefetch_limit = 1


def forward_target_after_next_iter(original: Any, eod: Any, current_handle: Any) -> Any:
    """``get_handle_to_forward_prefetch`` that returns nothing until ``next_iter`` has run once: a record that
    counts as complete only after the first backward."""
    return None if eod.is_first_iter else original(eod, current_handle)


# -- exercises: recipes above as puzzles (fsdp-readings exercise 04-forward-prefetch) ----------------------------
_EOD = "torch.distributed.fsdp._exec_order_utils:_ExecOrderData"

EXERCISES = (
    Exercise(
        "two-ahead",
        claim="follows-iteration-1-order",
        patches=(wrapping(f"{_EOD}.get_handle_to_forward_prefetch", prefetch_two_ahead),),
        puzzle="`get_handle_to_forward_prefetch` looks two units ahead in the recorded order instead of one.",
        reason="prefetch-order",
    ),
    Exercise(
        "record-every-iteration",
        claim="stale-order-after-change",
        patches=(wrapping(f"{_EOD}.next_iter", next_iter_forgetting_order),),
        puzzle="`next_iter` also forgets the recorded pre-forward order, so every iteration records it afresh.",
        reason="not-the-recorded-order",
    ),
)
