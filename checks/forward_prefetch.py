"""Checks for guide 04, forward prefetch: the order recorded in iteration 1, followed from iteration 2 on."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise

from torch import nn

from checks.context import RankContext
from checks.gpt_fsdp import ROOT, batch, fsdp1_gpt, units
from checks.probes import EventLog, clock, record_events
from checks.timeline import unit
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
    return [f"{unit(e.fqn)} -> {unit(e.target)}" for e in events.select("prefetch", iteration=iteration)
            if e.state == "FORWARD"]  # fmt: skip


def compute_order(marks: dict[str, list[int]], iteration: int) -> list[str]:
    """Units in the order their own compute started in that iteration (one forward per iteration)."""
    return sorted(marks, key=lambda name: marks[name][iteration - 1])


def model_prefetches(recorded: list[str], used: list[str]) -> list[str]:
    """The guide's rule as a model: when unit U runs its pre-forward, it prefetches the unit after it in the
    *recorded* order, unless that unit already ran its pre-forward or was already prefetched this iteration."""
    done: set[str] = set()
    prefetched: set[str] = set()
    out = []
    for current in used:
        done.add(current)
        position = recorded.index(current)
        if position + 1 < len(recorded):
            target = recorded[position + 1]
            if target not in done and target not in prefetched:
                prefetched.add(target)
                out.append(f"{current} -> {target}")
    return out


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
    assert first == [], f"iteration 1 prefetched in forward: {first}"
    assert second, "iteration 2 did not prefetch in forward either: forward_prefetch is not active at all"
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
    assert expected == [" ".join(s.split()) for s in stated], (
        f"iteration 1's forward order {recorded} does not give the prefetches the guide states: {stated}"
    )
    for iteration in (2, 3):
        observed = forward_prefetches(events, iteration)
        assert observed == expected, f"iteration {iteration} prefetched {observed}, expected {expected}"
        for e in events.select("prefetch", iteration=iteration):
            if e.state != "FORWARD":
                continue
            issuer = unit(e.fqn)
            compute = marks[issuer][iteration - 1]
            assert e.seq < compute, f"iteration {iteration}: {issuer}'s prefetch came after its compute started"
        unsharded = [unit(e.fqn) for e in events.select("unshard", iteration=iteration) if e.state == "FORWARD"]
        assert unsharded == [ROOT], f"iteration {iteration}: pre-forward unshards of {unsharded}, expected only root"
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
    assert used == [ROOT, "blocks.2", "blocks.1", "blocks.0"], f"the reversed forward ran in the order {used}"
    observed = forward_prefetches(events, 2)
    static = model_prefetches(recorded, used)
    dynamic = [f"{a} -> {b}" for a, b in pairwise(used)]
    assert observed == static, f"iteration 2 prefetched {observed}; the iteration-1 order predicts {static}"
    assert observed != dynamic, f"iteration 2 followed its own new order {dynamic}: the order is not static"
    return {"recorded": recorded, "used": used, "prefetched": observed}
