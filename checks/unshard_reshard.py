"""Checks for guide 03, unshard and reshard around forward."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp import _runtime_utils as ru
from torch.distributed.fsdp._limiter_utils import _FreeEventQueue

from checks.context import RankContext
from checks.gpt_fsdp import ROOT, batch, fsdp1_gpt, units
from checks.layout_spec import gpt_padded_sizes
from checks.probes import assert_sequence, record_comm, record_events

FREES_AFTER_FORWARD = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}  # the guide's table, by strategy


def _unsharded_bytes(model: torch.nn.Module) -> dict[str, int]:
    """Bytes held by each unit's padded unsharded flat parameter (0 once FSDP freed its storage)."""
    return {
        name: unit._handle.flat_param._full_param_padded.untyped_storage().nbytes()
        for name, unit in units(model).items()
    }


def after_forward_storage(ctx: RankContext, strategy: str) -> dict[str, int]:
    """After a forward, a non-root unit's unsharded storage is freed iff the strategy reshards after forward;
    the root keeps its storage under every strategy."""
    model = fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy[strategy])
    x, y = batch(ctx)
    model(x, y)
    held = _unsharded_bytes(model)
    full = {name: 4 * numel for name, numel in gpt_padded_sizes(ctx.world_size, element_bytes=4).items()}
    frees = FREES_AFTER_FORWARD[strategy]
    expected = {name: 0 if frees and name != ROOT else full[name] for name in held}
    assert held == expected, f"{strategy}: unsharded bytes held after forward {held}, expected {expected}"
    return held


def shard_grad_op_gathers_only_in_forward(ctx: RankContext, steps: int = 2, use_orig_params: bool = True) -> list[int]:
    """SHARD_GRAD_OP all-gathers every unit in forward and nothing in backward, every step."""
    model = fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy.SHARD_GRAD_OP, use_orig_params=use_orig_params)
    n_units = len(units(model))
    counts = []
    for step in range(steps):
        x, y = batch(ctx, step=step)
        with record_comm() as comm:
            _, loss = model(x, y)
            loss.backward()
        forward, backward = comm.count("all_gather", in_backward=False), comm.count("all_gather", in_backward=True)
        assert (forward, backward) == (n_units, 0), (
            f"step {step + 1}: {forward} all-gathers in forward and {backward} in backward; "
            f"SHARD_GRAD_OP should give {n_units} and 0"
        )
        counts.append(forward)
    return counts


def one_all_gather_per_unit_per_forward(ctx: RankContext, steps: int = 2) -> list[list[int]]:
    """Every forward (the first and the steady state) issues exactly one all-gather per unit, in forward order,
    each of the unit's padded unsharded size."""
    model = fsdp1_gpt(ctx)
    observed = []
    for step in range(steps):
        x, y = batch(ctx, step=step)
        with record_comm() as comm:
            _, loss = model(x, y)
        loss.backward()
        # Forward order is unit order here (root's forward starts first, then each block); sizes from the
        # layout model, not from FSDP's state.
        expected = list(gpt_padded_sizes(ctx.world_size, element_bytes=4).values())
        sizes = [c.numel for c in comm.select("all_gather")]
        assert_sequence(sizes, expected, what=f"forward {step + 1}'s all-gather sizes (one per unit)")
        callers = {c.caller.split(":")[1] for c in comm.select("all_gather")}
        assert callers == {"FlatParamHandle._all_gather_flat_param"}, f"all-gathers issued from {callers}"
        observed.append(sizes)
    return observed


def reshard_clears_prefetched(ctx: RankContext) -> list[str]:
    """``_reshard`` sets ``_prefetched = False`` whether it frees or keeps, on every unit."""
    model = fsdp1_gpt(ctx)
    x, y = batch(ctx)
    _, loss = model(x, y)
    loss.backward()  # every handle idle and resharded
    cleared = []
    for name, unit in units(model).items():
        handle = unit._handle
        for free in (False, True):
            ru._unshard(unit, handle, unit._unshard_stream, unit._pre_unshard_stream)
            handle._prefetched = True  # what _prefetch_handle leaves behind
            ru._reshard(unit, handle, free)
            assert handle._prefetched is False, f"{name}: _reshard(free={free}) left _prefetched={handle._prefetched}"
            cleared.append(f"{name} free={free}")
    return cleared


class _CountingQueue(_FreeEventQueue):
    """FSDP's free-event queue, unchanged, that also writes down what each call saw."""

    def __init__(self, pending: Any) -> None:
        super().__init__()
        self._queue = pending
        self.calls: list[str] = []

    def enqueue(self, free_event: Any) -> None:
        super().enqueue(free_event)
        self.calls.append(f"queue {len(self._queue)}")

    def dequeue_if_needed(self) -> Any:
        before = len(self._queue)
        event = super().dequeue_if_needed()
        self.calls.append(f"unshard {before} {'wait' if event is not None else 'go'}")
        return event


def rate_limiter_model(events: list[str], pending: int, limit: int) -> list[str]:
    """The guide's rule: a freeing reshard queues one event; an unshard (for itself or as a prefetch) that finds
    ``limit`` or more queued waits for the oldest."""
    out = []
    for kind in events:
        if kind in ("unshard", "prefetch"):
            waits = pending >= limit
            out.append(f"unshard {pending} {'wait' if waits else 'go'}")
            pending -= waits
        elif kind == "free":
            pending += 1
            out.append(f"queue {pending}")
    return out


def rate_limiter_waits_as_the_rule_says(ctx: RankContext, limit_all_gathers: bool = True) -> list[str]:
    """Over a steady-state step, the free-event queue's enqueues and waits are exactly what the rule predicts from
    the step's own order of unshards and frees; without limit_all_gathers nothing is queued and nothing waits."""
    model = fsdp1_gpt(ctx, limit_all_gathers=limit_all_gathers)
    x, y = batch(ctx)
    model(x, y)[1].backward()  # lazy init; the queue exists and holds what iteration 1 left
    queue = _CountingQueue(units(model)[ROOT]._free_event_queue._queue)
    for unit in units(model).values():
        unit._free_event_queue = queue  # one queue for the tree, as lazy init shares it
    pending = len(queue._queue)
    with record_events(model) as events:
        model(*batch(ctx, step=1))[1].backward()
    kinds = [e.kind for e in events if e.kind in ("unshard", "prefetch", "free")]
    limit = queue._max_num_inflight_all_gathers
    # Without limit_all_gathers the queue is not consulted at all.
    expected = rate_limiter_model(kinds, pending, limit) if limit_all_gathers else []
    assert_sequence(queue.calls, expected, what=f"free-event queue (limit_all_gathers={limit_all_gathers})")
    if limit_all_gathers:
        assert any(c.endswith("wait") for c in expected), "the step never reached the limit: nothing was tested"
    return queue.calls
