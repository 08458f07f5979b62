"""Checks for guide 03, unshard and reshard around forward."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp import _runtime_utils as ru
from torch.distributed.fsdp._limiter_utils import _FreeEventQueue

from checks.breakit.exercises import Exercise
from checks.breakit.patches import set_to, wrapping
from checks.expected import Expected
from checks.models.flat_param import layout
from checks.models.rate_limiter import queue_calls
from checks.naming import ROOT, clean
from checks.probes.comm import record_comm
from checks.probes.events import record_events
from checks.probes.expect import assert_sequence
from checks.probes.memory_series import record_memory_series
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.gpt import batch, fsdp1_gpt, padded_sizes, unit_numels, unit_of_parameter, units
from mini_gpt import GPT, preset

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
    full = {name: 4 * numel for name, numel in padded_sizes(ctx.world_size, element_bytes=4).items()}
    frees = FREES_AFTER_FORWARD[strategy]
    expected = {name: 0 if frees and name != ROOT else full[name] for name in held}
    require_equal(held, expected, reason="held-after-forward", what=f"{strategy}: unsharded bytes held after forward")
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
        require_equal(
            {"forward": forward, "backward": backward},
            {"forward": n_units, "backward": 0},
            reason="all-gather-count",
            what=f"step {step + 1}: SHARD_GRAD_OP all-gathers",
            step=step + 1,
        )
        counts.append(forward)
    return counts


def _gathered_units(events: Any, comm: Any) -> list[tuple[str, Any]]:
    """Each all-gather with the unit it gathered: the unit of the latest unshard or prefetch (its target) that
    began before the collective was issued (one clock orders both recordings)."""
    starts = sorted(
        (e.seq, e.target if e.kind == "prefetch" else e.unit) for e in events if e.kind in ("unshard", "prefetch")
    )
    named = []
    for c in comm.select("all_gather"):
        before = [unit for seq, unit in starts if seq < c.seq]
        named.append((before[-1] if before else "?", c))
    return named


def one_all_gather_per_unit_per_forward(ctx: RankContext, expected: Expected, steps: int = 2) -> list[list[str]]:
    """Every forward (the first and the steady state) issues exactly one all-gather per unit, in forward order,
    each of the unit's padded unsharded size, joining ``world_size`` equal shards. Each all-gather is named by the
    unit whose unshard issued it, and the guide's rows (unit, size) must be the model's: units in the model's
    module order (the root's forward starts first, then each block), sizes from the layout model."""
    modelled = [f"{unit} {numel}" for unit, numel in padded_sizes(ctx.world_size, element_bytes=4).items()]
    # The guide is what is checked here: its rows are the observed value, the model's the expected one.
    off = [row for row, want in zip(expected, modelled, strict=False) if row.flat != want] or expected.rows[-1:]
    message = f"the guide's all-gathers, by the model: {expected.flats!r}, expected {modelled!r}"
    expected.require(expected.flats == modelled, off, "guide-differs-from-model", message, observed=expected.flats,
                     expected=modelled)  # fmt: skip
    model = fsdp1_gpt(ctx)
    observed = []
    for step in range(steps):
        x, y = batch(ctx, step=step)
        with record_comm() as comm, record_events(model) as events:
            _, loss = model(x, y)
        loss.backward()
        named = _gathered_units(events, comm)
        rows = [f"{unit} {c.numel}" for unit, c in named]
        what = f"forward {step + 1}'s all-gathers (unit, elements), one per unit in forward order"
        expected.require_rows(rows, reason="all-gathers-by-unit", what=what, forward=step + 1)
        shards = [f"{unit} {sorted(set(c.numels))} x {len(c.numels)}" for unit, c in named]
        wanted = [f"{unit} {[c.numel // ctx.world_size]} x {ctx.world_size}" for unit, c in named]
        what = f"forward {step + 1}: each all-gather joins one equal shard per rank"
        require_equal(shards, wanted, reason="all-gather-shards", what=what, forward=step + 1)
        callers = sorted({c.caller.split(":")[1] for _, c in named})
        require_equal(callers, ["FlatParamHandle._all_gather_flat_param"], reason="all-gather-caller", what="callers")
        observed.append(rows)
    return observed


def _parameter_shapes(preset_name: str = "tiny") -> dict[str, tuple[int, ...]]:
    """Each original parameter's shape, from the model built on the meta device (no FSDP involved)."""
    with torch.device("meta"):
        model = GPT(preset(preset_name))
    return {name: tuple(param.shape) for name, param in model.named_parameters()}


def _expected_views(rank: int, world_size: int, strategy: str) -> dict[str, str]:
    """What each original parameter should look like after a forward with grad enabled, by the rule the guide
    reads in ``_use_sharded_flat_param``: SHARD_GRAD_OP skips the sharded views (the module keeps plain tensors of
    the full shape over the unsharded buffer); FULL_SHARD switches every unit, the root included, to 1-D
    parameters over this rank's shard (empty where the shard holds none of it), sized by the flat-parameter
    layout model."""
    shapes = _parameter_shapes()
    if strategy == "SHARD_GRAD_OP":
        return {name: f"Tensor {shape} over the unsharded buffer" for name, shape in shapes.items()}
    in_shard = {unit: list(layout(numels, 4, world_size).in_shard(rank)) for unit, numels in unit_numels().items()}
    expected = {}
    for name in shapes:  # registration order, the order the layout model lists each unit's parameters in
        numel = in_shard[unit_of_parameter(name, in_shard)].pop(0)
        expected[name] = f"Parameter ({numel},) " + ("over the shard" if numel else "empty")
    return expected


def _describe_view(param: torch.Tensor, handle: Any) -> str:
    """``<type> <shape> <what its data lies in>``, the last read from storage identity."""
    storage = param.untyped_storage().data_ptr()
    if param.numel() == 0:
        where = "empty"
    elif storage == handle.flat_param._local_shard.untyped_storage().data_ptr():
        where = "over the shard"
    elif storage == handle.flat_param._full_param_padded.untyped_storage().data_ptr():
        where = "over the unsharded buffer"
    else:
        where = "elsewhere"
    return f"{type(param).__name__} {tuple(param.shape)} {where}"


def views_after_forward(ctx: RankContext, strategy: str) -> dict[str, str]:
    """After a forward with grad enabled, every unit's flat parameter is its local shard. Under FULL_SHARD each
    original parameter is a 1-D Parameter over this rank's part of the shard (the root's too, though its
    unsharded storage is kept); under SHARD_GRAD_OP each stays a plain tensor of its full shape over the unsharded
    buffer."""
    model = fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy[strategy])
    model(*batch(ctx))
    shard = {name: numel // ctx.world_size for name, numel in padded_sizes(ctx.world_size, 4).items()}
    flat = {
        name: unit._handle.flat_param.numel()
        if unit._handle.flat_param.data_ptr() == unit._handle.flat_param._local_shard.data_ptr()
        else "not the local shard"
        for name, unit in units(model).items()
    }
    require_equal(flat, shard, reason="flat-not-sharded", what=f"{strategy}: flat parameters after forward")
    handles = {name: unit._handle for name, unit in units(model).items()}
    views = {}
    for path, param in model.named_parameters():
        name = clean(path)
        views[name] = _describe_view(param, handles[unit_of_parameter(name, handles)])
    expected = _expected_views(ctx.rank, ctx.world_size, strategy)
    require_equal(views, expected, reason="views-after-forward", what=f"{strategy}: original parameters after forward")
    return views


def root_kept_without_backward(ctx: RankContext, forwards: int = 3) -> dict[str, list]:
    """With no backward between forwards (evaluation under no_grad), the root's unsharded storage is never freed:
    only the first forward all-gathers it, every later one gathers just the blocks."""
    model = fsdp1_gpt(ctx)
    model.eval()
    sizes = padded_sizes(ctx.world_size, element_bytes=4)
    observed = []
    with torch.no_grad():
        for i in range(forwards):
            with record_comm() as comm:
                model(batch(ctx, step=i)[0])
            gathered = [c.numel for c in comm.select("all_gather")]
            expected = [numel for name, numel in sizes.items() if i == 0 or name != ROOT]
            assert_sequence(gathered, expected, what=f"forward {i + 1}'s all-gather sizes", reason="all-gather-sizes")
            held = _unsharded_bytes(model)[ROOT]
            message = f"after forward {i + 1} the root holds {held} unsharded bytes, expected {4 * sizes[ROOT]}"
            require(held == 4 * sizes[ROOT], "root-freed", message, forward=i + 1, observed=held)
            observed.append(gathered)
    return {"sizes": observed, "counts": [len(sizes) for sizes in observed]}


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
            message = f"{name}: _reshard(free={free}) left _prefetched={handle._prefetched}"
            require(handle._prefetched is False, "prefetched-kept", message, unit=name, free=free)
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


def rate_limiter_waits_as_the_rule_says(
    ctx: RankContext, limit_all_gathers: bool = True, pending_at_start: int | None = None
) -> dict[str, Any]:
    """Over the first step and a steady-state one, the free-event queue's enqueues and waits are exactly what the
    rule predicts from each step's own order of unshards and frees; the queue the second step starts with is what
    the rule leaves after the first (``pending_at_start``, the guide's figure). Without limit_all_gathers nothing
    is queued and no unshard consults the queue, in either step, although both free units."""
    model = fsdp1_gpt(ctx, limit_all_gathers=limit_all_gathers)
    queue = _CountingQueue(type(model._free_event_queue._queue)())
    model._free_event_queue = queue  # before lazy init, which hands the root's queue to every unit
    limit = queue._max_num_inflight_all_gathers
    what = f"free-event queue (limit_all_gathers={limit_all_gathers})"
    pending, largest, calls = 0, 0, []
    for iteration in (1, 2):
        with record_events(model) as events:
            model(*batch(ctx, step=iteration - 1))[1].backward()
        if iteration == 1:
            shared = sorted(name for name, unit in units(model).items() if unit._free_event_queue is not queue)
            require(not shared, "queue-not-shared", f"units with a queue of their own: {shared}", observed=shared)
        kinds = [e.kind for e in events if e.kind in ("unshard", "prefetch", "free")]
        require("free" in kinds, "nothing-freed", f"iteration {iteration} freed no unit: nothing was tested")
        # Without limit_all_gathers the queue is not consulted at all.
        expected = queue_calls(kinds, pending, limit) if limit_all_gathers else []
        require_equal(queue.calls, expected, reason="queue-differs", what=what, iteration=iteration)
        queued = [int(call.split()[1]) for call in queue.calls if call.startswith("queue")]
        largest = max([largest, pending, *queued])
        if iteration == 1:
            modelled = (
                pending + sum(c.startswith("queue") for c in expected) - sum(c.endswith("wait") for c in expected)
            )
            require_equal(len(queue._queue), modelled, reason="queue-left", what="events queued after iteration 1")
            pending = modelled
            if pending_at_start is not None:
                what_start = "events queued when iteration 2 starts, against the guide's figure"
                require_equal(pending_at_start, pending, reason="pending-differs-from-guide", what=what_start)
        calls = list(queue.calls)
        queue.calls.clear()
    if limit_all_gathers:
        waits = any(c.endswith("wait") for c in calls)
        require(waits, "limit-never-reached", "the step never reached the limit: nothing was tested")
    return {"calls": calls, "pending_at_start": pending, "largest_queue": largest}


def memory_over_the_step(
    ctx: RankContext, unsharded_after_forward: dict[str, int], extra_bytes: int, all_gathers: dict[str, int]
) -> dict[str, Any]:
    """One step of FULL_SHARD and of SHARD_GRAD_OP, with a memory snapshot after each unit's forward and
    post-backward: at the end of forward SHARD_GRAD_OP holds exactly the three blocks' padded unsharded flat
    parameters more (from the layout model), and over the step it issues one all-gather fewer per block. The
    guide's figures (the kwargs) must be the model's, and the run's."""
    sizes = padded_sizes(ctx.world_size, element_bytes=4)
    blocks = [name for name in sizes if name != ROOT]
    modelled = {
        "unsharded_after_forward": {  # the root is kept by both; only SHARD_GRAD_OP keeps the blocks
            "FULL_SHARD": 4 * sizes[ROOT],
            "SHARD_GRAD_OP": 4 * sum(sizes.values()),
        },
        "extra_bytes": sum(4 * sizes[name] for name in blocks),
        "all_gathers": {"FULL_SHARD": len(sizes) + len(blocks), "SHARD_GRAD_OP": len(sizes)},
    }
    stated = {
        "unsharded_after_forward": unsharded_after_forward,
        "extra_bytes": extra_bytes,
        "all_gathers": all_gathers,
    }
    require_equal(stated, modelled, reason="guide-differs-from-model", what="the guide's figures, by the model")
    series: dict[str, list[tuple[str, dict[str, int]]]] = {}
    gathers: dict[str, int] = {}
    for strategy in ("FULL_SHARD", "SHARD_GRAD_OP"):
        model = fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy[strategy])
        optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x, y = batch(ctx)
        with record_comm() as comm, record_memory_series(model, optim) as recorder:
            recorder.mark("start")
            loss = model(x, y)[1]
            recorder.mark("after forward")
            loss.backward()
            recorder.mark("after backward")
            optim.step()
            recorder.mark("after step")
        series[strategy] = recorder.series.points
        gathers[strategy] = comm.count("all_gather")

    held = {strategy: dict(points)["after forward"]["unsharded"] for strategy, points in series.items()}
    what = "unsharded bytes held after forward, per strategy"
    require_equal(held, unsharded_after_forward, reason="unsharded-after-forward", what=what)
    require_equal(gathers, all_gathers, reason="all-gathers-per-step", what="all-gathers per step, per strategy")
    # Both equal the model, so SHARD_GRAD_OP holds `extra_bytes` more and saves one all-gather per block.
    return {
        "series": series,
        "all_gathers": gathers,
        "extra_unsharded_bytes": held["SHARD_GRAD_OP"] - held["FULL_SHARD"],
    }


# -- break-it recipes: this guide's behaviour bent on purpose (tests/break_it/ applies them) --------------


def reshard_everything(original: Any, state: Any, handle: Any) -> None:
    """``_post_forward_reshard`` that frees every unit, the root included."""
    from torch.distributed.fsdp import _runtime_utils

    if handle:
        _runtime_utils._reshard(state, handle, True)


def every_sharded_strategy(original: Any) -> tuple[Any, ...]:
    """A RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES that also frees SHARD_GRAD_OP units after forward."""
    from torch.distributed.fsdp._flat_param import HandleShardingStrategy

    return (*original, HandleShardingStrategy.SHARD_GRAD_OP)


def all_gather_twice(original: Any, handle: Any, padded_unsharded_flat_param: Any) -> Any:
    """``FlatParamHandle._all_gather_flat_param`` that gathers the same shard twice."""
    original(handle, padded_unsharded_flat_param)
    return original(handle, padded_unsharded_flat_param)


def reshard_keeping_prefetched(original: Any, state: Any, handle: Any, free_unsharded_flat_param: bool) -> None:
    """``_reshard`` that restores the handle's ``_prefetched`` flag afterwards (the pre-2.2 behaviour, roughly)."""
    prefetched = handle._prefetched
    original(state, handle, free_unsharded_flat_param)
    handle._prefetched = prefetched


def dequeue_at_one(original: Any, queue: Any) -> Any:
    """``_FreeEventQueue.dequeue_if_needed`` with a threshold of one pending free instead of two."""
    return queue._dequeue() if queue._queue else None


def unshard_consulting_the_queue(original: Any, state: Any, handle: Any, *args: Any) -> None:
    """``_unshard`` that asks the free-event queue even when limit_all_gathers is off."""
    if handle and not state.limit_all_gathers:
        state._free_event_queue.dequeue_if_needed()
    original(state, handle, *args)


def reshard_views_for_every_strategy(original: Any) -> tuple[Any, ...]:
    """A NO_RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES that also lists FULL_SHARD: FULL_SHARD units then skip their
    sharded views after forward too."""
    from torch.distributed.fsdp._flat_param import HandleShardingStrategy

    return (*original, HandleShardingStrategy.FULL_SHARD)


def reshard_queueing_regardless(original: Any, state: Any, handle: Any, free_unsharded_flat_param: bool) -> None:
    """``_reshard`` that queues a free event for every freeing reshard even when limit_all_gathers is off."""
    original(state, handle, free_unsharded_flat_param)
    if free_unsharded_flat_param and not state.limit_all_gathers:
        state._free_event_queue.enqueue(state._device_handle.Event())


# -- exercises: recipes above as puzzles (fsdp-readings exercise 03-unshard-reshard) ----------------------------
_RU = "torch.distributed.fsdp._runtime_utils"
_FP = "torch.distributed.fsdp._flat_param"

EXERCISES = (
    Exercise(
        "prefetched-flag-kept",
        claim="reshard-clears-prefetched",
        patches=(wrapping(f"{_RU}:_reshard", reshard_keeping_prefetched),),
        puzzle="`_reshard` runs as usual, then puts the handle's `_prefetched` flag back to what it was before.",
        reason="prefetched-kept",
    ),
    Exercise(
        "nothing-reshards-after-forward",
        claim="full-shard-frees-non-roots",
        patches=(set_to(f"{_FP}:RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES", ()),),
        puzzle="The tuple of strategies that free after forward is emptied: no unit counts as one that reshards.",
        reason="held-after-forward",
    ),
)


def unshard_blocks_1_before_blocks_0(original: Any, state: Any, handle: Any) -> None:
    """``_pre_forward_unshard`` that, at ``blocks.0``, first unshards ``blocks.1`` as a prefetch would (forward
    training state, then marked prefetched): every unit is still all-gathered once, at its own size, but
    ``blocks.1`` before ``blocks.0``."""
    from torch.distributed.fsdp._flat_param import HandleTrainingState

    if handle and handle._handle_index == 1:  # pre-order over the tree: root 0, blocks.0 1, blocks.1 2
        after = state._exec_order_data.all_handles[2]
        previous, after._training_state = after._training_state, HandleTrainingState.FORWARD
        ru._unshard(state, after, state._unshard_stream, state._pre_unshard_stream)
        after._training_state = previous
        after._prefetched = True
    original(state, handle)


def reshard_keeping_blocks_1_in_backward(
    original: Any, state: Any, handle: Any, free_unsharded_flat_param: bool
) -> None:
    """``_reshard`` that keeps ``blocks.1``'s unsharded storage after its post-backward hook: the next forward
    finds it unsharded and issues no all-gather for it."""
    from torch.distributed.fsdp._flat_param import HandleTrainingState

    if handle._handle_index == 2 and handle._training_state == HandleTrainingState.BACKWARD_POST:
        free_unsharded_flat_param = False
    original(state, handle, free_unsharded_flat_param)


def unshard_blocks_0_again_for_a_kept_unit(original: Any, state: Any, handle: Any) -> None:
    """``_pre_forward_unshard`` that, for a unit that needs no all-gather (kept unsharded), all-gathers
    ``blocks.0`` again in its place and frees it: with `reshard_keeping_blocks_1_in_backward`, the second forward
    gathers ``blocks.0`` twice and ``blocks.1`` never, four all-gathers of the same sizes."""
    if handle and not handle.needs_unshard() and handle._handle_index != 0:
        again = state._exec_order_data.all_handles[1]
        ru._unshard(state, again, state._unshard_stream, state._pre_unshard_stream)
        ru._reshard(state, again, True)
    original(state, handle)


def unshard_consulting_the_queue_in_iteration_1(original: Any, state: Any, handle: Any, *args: Any) -> None:
    """``_unshard`` that asks the free-event queue when limit_all_gathers is off, in the first iteration only
    (nothing was queued, so it never waits, and the queue ends the iteration empty)."""
    if handle and not state.limit_all_gathers and state._exec_order_data.is_first_iter:
        state._free_event_queue.dequeue_if_needed()
    original(state, handle, *args)
