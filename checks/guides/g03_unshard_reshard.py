"""Checks for guide 03, unshard and reshard around forward."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp import _runtime_utils as ru
from torch.distributed.fsdp._limiter_utils import _FreeEventQueue

from checks.breakit.exercises import Exercise
from checks.breakit.patches import set_to, wrapping
from checks.models.flat_param import layout
from checks.models.rate_limiter import queue_calls
from checks.naming import ROOT, clean
from checks.probes import assert_sequence, record_comm, record_events
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
        expected = list(padded_sizes(ctx.world_size, element_bytes=4).values())
        sizes = [c.numel for c in comm.select("all_gather")]
        what = f"forward {step + 1}'s all-gather sizes (one per unit)"
        assert_sequence(sizes, expected, what=what, reason="all-gather-sizes")
        callers = sorted({c.caller.split(":")[1] for c in comm.select("all_gather")})
        require_equal(callers, ["FlatParamHandle._all_gather_flat_param"], reason="all-gather-caller", what="callers")
        observed.append(sizes)
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


def rate_limiter_waits_as_the_rule_says(ctx: RankContext, limit_all_gathers: bool = True) -> dict[str, Any]:
    """Over a steady-state step, the free-event queue's enqueues and waits are exactly what the rule predicts from
    the step's own order of unshards and frees; without limit_all_gathers nothing is queued (in iteration 1 either)
    and nothing waits."""
    model = fsdp1_gpt(ctx, limit_all_gathers=limit_all_gathers)
    x, y = batch(ctx)
    model(x, y)[1].backward()  # lazy init; the queue exists and holds what iteration 1 left
    queue = _CountingQueue(units(model)[ROOT]._free_event_queue._queue)
    for unit in units(model).values():
        unit._free_event_queue = queue  # one queue for the tree, as lazy init shares it
    pending = len(queue._queue)
    if not limit_all_gathers:
        message = f"iteration 1 queued {pending} free events with limit_all_gathers=False"
        require(pending == 0, "queued-without-limit", message, observed=pending)
    with record_events(model) as events:
        model(*batch(ctx, step=1))[1].backward()
    kinds = [e.kind for e in events if e.kind in ("unshard", "prefetch", "free")]
    limit = queue._max_num_inflight_all_gathers
    # Without limit_all_gathers the queue is not consulted at all.
    expected = queue_calls(kinds, pending, limit) if limit_all_gathers else []
    what = f"free-event queue (limit_all_gathers={limit_all_gathers})"
    assert_sequence(queue.calls, expected, what=what, reason="queue-differs")
    if limit_all_gathers:
        waits = any(c.endswith("wait") for c in expected)
        require(waits, "limit-never-reached", "the step never reached the limit: nothing was tested")
    queued = [int(call.split()[1]) for call in queue.calls if call.startswith("queue")]
    return {"calls": queue.calls, "pending_at_start": pending, "largest_queue": max([pending, *queued])}


def memory_over_the_step(ctx: RankContext) -> dict[str, Any]:
    """One step of FULL_SHARD and of SHARD_GRAD_OP, with a memory snapshot after each unit's forward and
    post-backward: at the end of forward SHARD_GRAD_OP holds exactly the three blocks' padded unsharded flat
    parameters more (from the layout model), and over the step it issues one all-gather fewer per block."""
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
    sizes = padded_sizes(ctx.world_size, element_bytes=4)
    blocks = [name for name in sizes if name != ROOT]
    expected_extra = sum(4 * sizes[name] for name in blocks)

    def unsharded(strategy: str) -> int:
        return dict(series[strategy])["after forward"]["unsharded"]

    extra = unsharded("SHARD_GRAD_OP") - unsharded("FULL_SHARD")
    what = "unsharded bytes SHARD_GRAD_OP holds beyond FULL_SHARD after forward"
    require_equal(extra, expected_extra, reason="extra-unsharded-bytes", what=what)
    saved = gathers["FULL_SHARD"] - gathers["SHARD_GRAD_OP"]
    require_equal(saved, len(blocks), reason="all-gathers-saved", what="all-gathers SHARD_GRAD_OP saves per step")
    return {"series": series, "all_gathers": gathers, "extra_unsharded_bytes": extra}


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
