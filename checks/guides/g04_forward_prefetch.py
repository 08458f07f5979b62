"""Checks for guide 04, forward prefetch: the order recorded in iteration 1, followed from iteration 2 on."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import torch
from torch import nn

from checks.breakit.exercises import Exercise
from checks.breakit.patches import wrapping
from checks.expected import Expected, Row
from checks.models import autograd_order
from checks.models.prefetch import forward_prefetches as model_forward_prefetches
from checks.models.unit_counts import unit_counts
from checks.naming import ROOT
from checks.probes import clock
from checks.probes.compute_marks import ComputeMarks
from checks.probes.event_log import EventLog
from checks.probes.events import record_events
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.gpt import batch, fsdp1_gpt, padded_sizes, units
from checks.workloads.reorderable import ReorderableGPT


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


def follows_iteration_1_order(ctx: RankContext, expected: Expected) -> list[str]:
    """From iteration 2, each unit's pre-forward prefetches the next unit of iteration 1's order (as the guide
    states it), before the issuing unit's own compute; prefetched units are then not unsharded again."""
    model = fsdp1_gpt(ctx, forward_prefetch=True)
    marks = _compute_marks(model)
    with record_events(model) as events:
        for step in range(3):
            _, loss = model(*batch(ctx, step=step))
            loss.backward()
    recorded = compute_order(marks, 1)
    modelled = [f"{a} -> {b}" for a, b in pairwise(recorded)]
    what = f"the prefetches iteration 1's forward order {recorded} gives, against the guide's"
    expected.require_rows(modelled, reason="order-differs-from-guide", what=what)
    for iteration in (2, 3):
        observed = forward_prefetches(events, iteration)
        expected.require_rows(observed, reason="prefetch-order", what=f"iteration {iteration}'s prefetches")
        for e in events.select("prefetch", iteration=iteration):
            if e.state != "FORWARD":
                continue
            compute = marks[e.unit][iteration - 1]
            message = f"iteration {iteration}: {e.unit}'s prefetch came after its compute started"
            require(e.seq < compute, "prefetch-after-compute", message, unit=e.unit, iteration=iteration)
        unsharded = [e.unit for e in events.select("unshard", iteration=iteration) if e.state == "FORWARD"]
        what = f"iteration {iteration}: units unsharded by their own pre-forward"
        require_equal(unsharded, [ROOT], reason="unsharded-again", what=what)
    return modelled


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


def _units_held(row: Row) -> list[str]:
    """A ``held-…`` row's units: ``blocks.0: root blocks.0 blocks.1`` holds three."""
    return row.value.split()


def _compute_points(unit: nn.Module) -> list[tuple[str, nn.Module]]:
    """Where a unit's own compute is sampled: each direct child of its wrapped module that runs before any child
    unit does (module order is forward order in mini_gpt: the root's embeddings, a block's four layers)."""
    points = []
    for name, child in unit._fsdp_wrapped_module.named_children():
        if isinstance(child, nn.ModuleList) or child in units(unit).values():
            break
        points.append((name, child))
    return points


def _storage_snapshots(model: nn.Module) -> tuple[dict[str, dict[str, int]], dict[str, list[tuple[str, list[str]]]]]:
    """Bytes held by every unit's padded unsharded buffer when each unit's own compute starts (a pre-hook on the
    wrapped module, which runs after FSDP's pre-forward), and which units hold any at each point through that
    compute (`_compute_points`, before and after each, and the wrapped module's end); a later forward overwrites
    the earlier one's."""
    seen: dict[str, dict[str, int]] = {}
    through: dict[str, list[tuple[str, list[str]]]] = {}
    all_units = units(model)

    def held() -> dict[str, int]:
        return {n: u._handle.flat_param._full_param_padded.untyped_storage().nbytes() for n, u in all_units.items()}

    def note(name: str, point: str) -> None:
        through.setdefault(name, []).append((point, [n for n, nbytes in held().items() if nbytes]))

    for name, fsdp_unit in all_units.items():

        def start(module: nn.Module, args: object, name: str = name) -> None:
            seen[name] = held()
            through[name] = []

        def end(module: nn.Module, args: object, out: object, name: str = name) -> None:
            if name != ROOT:  # the root's module ends after the blocks' compute, not its own
                note(name, "end")

        wrapped = fsdp_unit._fsdp_wrapped_module
        wrapped.register_forward_pre_hook(start)
        wrapped.register_forward_hook(end)
        for point, child in _compute_points(fsdp_unit):
            child.register_forward_pre_hook(lambda m, a, name=name, point=point: note(name, point))
            child.register_forward_hook(lambda m, a, o, name=name, point=point: note(name, f"after {point}"))
    return seen, through


def held_at_compute(ctx: RankContext, with_prefetch: Expected, without_prefetch: Expected) -> dict[str, Any]:
    """In iteration 2, which units' unsharded parameters are allocated when each unit's own compute starts, with
    and without forward prefetch, and that they stay so through that compute (sampled before and after each of
    the unit's own layers); each allocated one holds its whole padded size (from the layout model)."""
    full = {name: 4 * numel for name, numel in padded_sizes(ctx.world_size, element_bytes=4).items()}
    observed = {}
    for label, forward_prefetch, stated in (("with", True, with_prefetch), ("without", False, without_prefetch)):
        model = fsdp1_gpt(ctx, forward_prefetch=forward_prefetch)
        seen, through = _storage_snapshots(model)
        for step in range(2):  # iteration 2's snapshots replace iteration 1's
            _, loss = model(*batch(ctx, step=step))
            loss.backward()
        held = {unit: [n for n, nbytes in sizes.items() if nbytes] for unit, sizes in seen.items()}
        partial = {f"{unit}: {n}": nbytes for unit, sizes in seen.items() for n, nbytes in sizes.items()
                   if nbytes not in (0, full[n])}  # fmt: skip
        require(not partial, "partial-storage", f"storage neither freed nor whole: {partial}", observed=partial)
        what = f"units allocated at each unit's compute start, iteration 2, {label} forward prefetch"
        stated.require_values(held, reason="held-differs", what=what, value=_units_held, prefetch=label)
        for unit, points in through.items():
            require(len(points) > 1, "no-compute-points", f"{unit}: its compute was not sampled", unit=unit)
            row = stated.row(unit)
            want = _units_held(row)
            for point, units_held in points:
                message = f"{label} forward prefetch, {unit} at {point}: {units_held} allocated, not {want}"
                stated.require(units_held == want, row, "held-during-compute", message, prefetch=label,
                               point=f"{unit} {point}", observed=units_held, expected=want)  # fmt: skip
        observed[label] = held
    return observed


def prefetch_without_backward(ctx: RankContext, expected: Expected, forwards: int = 3) -> list[list[str]]:
    """With no backward at all (evaluation under no_grad) the first forward prefetches nothing and every later
    forward prefetches by the order the first one recorded: the record is complete after one forward, although
    ``next_iter`` never runs."""
    model = fsdp1_gpt(ctx, forward_prefetch=True)
    model.eval()
    observed = []
    with torch.no_grad():
        for i in range(forwards):
            with record_events(model) as events:
                model(batch(ctx, step=i)[0])
            prefetches = forward_prefetches(events, 1)  # no final callback ran: everything is iteration 1
            what = f"forward {i + 1}'s prefetches with no backward"
            if i == 0:  # the first forward has no record to follow yet
                require_equal(prefetches, [], reason="prefetch-order", what=what, forward=i + 1)
            else:
                expected.require_rows(prefetches, reason="prefetch-order", what=what, forward=i + 1)
            observed.append(prefetches)
    return observed


# -- what forward prefetch does to backward ---------------------------------------------------------------------
BLOCKS = ("blocks.0", "blocks.1", "blocks.2")
POST_FORWARD = (*BLOCKS, ROOT)


def _creation_order(model: nn.Module) -> list[tuple[str, int]]:
    """Autograd sequence numbers of what each unit's forward creates, appended as it runs: ``views U``, the last of
    the views of U's flat parameter that `_use_unsharded_views` created for this forward (kept in
    ``flat_param._tensors``, by its own pre-forward or by a prefetch, read when U's own module starts), and
    ``output U``, the last op of U's forward (its output's ``grad_fn``)."""
    seen: list[tuple[str, int]] = []
    for name, unit in units(model).items():
        flat_param = unit._handle.flat_param

        def views(module: nn.Module, args: Any, name: str = name, flat_param: Any = flat_param) -> None:
            numbers = [t.grad_fn._sequence_nr() for t in flat_param._tensors if t.grad_fn is not None]
            seen.append((f"views {name}", max(numbers) if numbers else -1))

        def output(module: nn.Module, args: Any, out: Any, name: str = name) -> None:
            last = out[-1] if isinstance(out, tuple) else out
            seen.append((f"output {name}", last.grad_fn._sequence_nr() if last.grad_fn is not None else -1))

        unit._fsdp_wrapped_module.register_forward_pre_hook(views)
        unit._fsdp_wrapped_module.register_forward_hook(output)
    return seen


def _modelled_creation(forward_prefetch: bool) -> list[str]:
    """The model's creation order as the recorder names it: the root's embeddings have no output of their own
    (the root module's output is its head's), so its first compute segment is not recorded."""
    labels, root_seen = [], False
    for node in autograd_order.mini_gpt_forward(ROOT, BLOCKS, forward_prefetch):
        if node.kind == autograd_order.COMPUTE and node.unit == ROOT and not root_seen:
            root_seen = True
            continue
        labels.append(f"{'views' if node.kind == autograd_order.VIEWS else 'output'} {node.unit}")
    return labels


def _backward_of_iteration_2(ctx: RankContext, forward_prefetch: bool) -> dict[str, Any]:
    """Iteration 2 of mini_gpt (BACKWARD_PRE, the default): its forward's creation order, its backward's hooks and
    prefetches, and the unsharded bytes at each compute start and after each post-backward hook."""
    from checks.probes.memory_series import record_memory_series

    model = fsdp1_gpt(ctx, forward_prefetch=forward_prefetch)
    marks = ComputeMarks(units(model))
    created = _creation_order(model)
    for step in range(2):
        created.clear()
        marks.seq.clear()
        x, y = batch(ctx, step=step)
        if step == 0:
            model(x, y)[1].backward()
            continue
        with record_events(model) as events, record_memory_series(model) as recorder:
            marks.on_mark = lambda unit, recorder=recorder: recorder.mark(f"compute {unit}")
            model(x, y)[1].backward()
    points = [(m.replace("backward ", "post-backward ", 1), b["unsharded"])
              for m, b in recorder.series.points if not m.startswith("forward ")]  # fmt: skip
    hooks = [
        e.describe() for e in events if e.kind in ("pre_backward", "post_backward", "prefetch") and e.state != "FORWARD"
    ]  # fmt: skip  (forward's own prefetches are follows-iteration-1-order's)
    return {"created": [label for label, _ in sorted(created, key=lambda c: c[1])], "hooks": hooks, "points": points}


def prefetch_reorders_backward(ctx: RankContext, with_prefetch: Expected, without_prefetch: Expected,
                               peaks: Expected) -> dict[str, Any]:  # fmt: skip
    """From iteration 2, forward prefetch changes the order of backward. A prefetch creates the next unit's views
    (the autograd nodes its parameters' gradients meet at) before the current unit's compute, and autograd runs the
    ready node created last first: so blocks.1's compute, and its pre-backward hook, come before blocks.2's views,
    and blocks.2's post-backward hook. The measured creation order, the backward's hooks and prefetches, and the
    units holding unsharded parameters at each moment are the torch-free model's (`checks.models.autograd_order`)
    and the guide's tables; with it the root and all three blocks are unsharded at once, the peak is the guide's."""
    sizes = {unit: 4 * numel for unit, numel in padded_sizes(ctx.world_size, element_bytes=4).items()}
    observed: dict[str, Any] = {}
    for label, forward_prefetch, table in (("with", True, with_prefetch), ("without", False, without_prefetch)):
        where = {"prefetch": label}
        made = autograd_order.mini_gpt_forward(ROOT, BLOCKS, forward_prefetch)
        sequence, moments = autograd_order.backward_with_prefetch(made, POST_FORWARD, kept=[ROOT])
        what = f"{label} forward prefetch: the model's units alive, against the guide's table"
        modelled = [f"{moment} {count}" for moment, count in moments]
        table.require_rows(modelled, reason="table-differs-from-model", what=what, **where)
        run = _backward_of_iteration_2(ctx, forward_prefetch)
        what = f"iteration 2, {label} forward prefetch: what forward created, in autograd's order"
        require_equal(run["created"], _modelled_creation(forward_prefetch), reason="creation-order", what=what,
                      **where)  # fmt: skip
        what = f"iteration 2, {label} forward prefetch: backward hooks and prefetches"
        require_equal(run["hooks"], sequence, reason="backward-order", what=what, **where)
        counts = []
        for moment, nbytes in run["points"]:
            found = unit_counts(nbytes, sizes)
            require(len(found) == 1, "not-whole-units", f"{label}: {nbytes} bytes at {moment} are not whole units",
                    moment=moment, nbytes=nbytes, **where)  # fmt: skip
            counts.append((moment, found.pop()))
        # Rows and moments are one list by now (the model's): a count is false on the row at its place.
        off = [row for row, got in zip(table, counts, strict=False) if got != (row.key, int(row.cells[1]))]
        message = f"iteration 2, {label} forward prefetch: units holding unsharded parameters: {counts!r}"
        table.require(counts == moments, off or table.rows[-1:], "units-alive", f"{message}, expected {moments!r}",
                      observed=counts, expected=moments, **where)  # fmt: skip
        peak, row = max(nbytes for _, nbytes in run["points"]), peaks.row(label)
        stated_peak = int(peaks.cells(row)["peak bytes"])
        message = f"{label}: peak unsharded bytes: {peak}, expected {stated_peak}"
        peaks.require(peak == stated_peak, row, "peak-bytes", message, observed=peak, expected=stated_peak, **where)
        observed[label] = {"created": run["created"], "hooks": run["hooks"], "alive": dict(counts), "peak": peak}
    observed["extra_bytes"] = observed["with"]["peak"] - observed["without"]["peak"]
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


def unshard_even_if_prefetched(original: Any, state: Any, handle: Any) -> None:
    """``_pre_forward_unshard`` that unshards a prefetched unit again: nothing is all-gathered (it is unsharded
    already), but `_use_unsharded_flat_param` creates its views anew, right before its own compute."""
    if handle:
        handle._prefetched = False
    original(state, handle)


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


_FORWARD_PREFETCHED: list[Any] = []  # the targets `prefetch_remembered` saw picked in forward, newest last


def prefetch_remembered(original: Any, state: Any, current_handle: Any) -> Any:
    """``_get_handle_to_prefetch`` unchanged, that remembers each target it picks in forward."""
    from torch.distributed.fsdp._flat_param import HandleTrainingState

    target = original(state, current_handle)
    if target is not None and current_handle._training_state == HandleTrainingState.FORWARD:
        _FORWARD_PREFETCHED.append(target)
    return target


def layer_norm_freeing_the_prefetch(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.nn.functional.layer_norm`` that first frees the unit prefetched last, if its own pre-forward has
    not run yet, and clears its flag (so that pre-forward gathers it again): the prefetched parameters are
    allocated when the current unit's compute starts, and gone after its first LayerNorm."""
    while _FORWARD_PREFETCHED:
        target = _FORWARD_PREFETCHED.pop()
        if target._prefetched and target._needs_pre_forward_unshard:
            target.reshard(True)
            target._prefetched = False
    return original(*args, **kwargs)
