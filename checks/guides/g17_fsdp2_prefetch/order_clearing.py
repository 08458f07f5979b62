"""Where and when the post-forward order is cleared: a watched list notes every ``clear()`` and the ``fully_shard``
functions on the stack; once per step at the end of the last backward, from the guide's call path (the callback
before torch 2.15, ``_end_backward_iteration`` from it), and under 2.15's manual finalization only when
``finalize_backward`` (or its handle's ``wait()``) ends the iteration."""

from __future__ import annotations

import os
import sys
import types
from typing import Any

from torch import nn

from checks.expected import Expected, Row
from checks.guides.g17_fsdp2_prefetch.steps import BLOCKS, arrow, described, loss_of
from checks.models.fsdp2_prefetch import prefetches
from checks.probes.calls import is_plumbing
from checks.probes.comm import record_comm
from checks.probes.events import record_events
from checks.ranks.context import RankContext
from checks.violation import Violation, require, require_equal
from checks.workloads.gpt import fsdp2_gpt

_FULLY_SHARD_DIR = f"{os.sep}torch{os.sep}distributed{os.sep}fsdp{os.sep}_fully_shard{os.sep}"


def fully_shard_path(frame: types.FrameType | None) -> list[str]:
    """The ``fully_shard`` functions on the stack from ``frame`` outwards, outermost first, as qualified names
    (``FSDPState._root_post_backward_final_callback``). Decorators' wrappers (``_dynamo_disable``'s ``wrapper``,
    local functions), the event recorder's trampolines and everything outside ``torch/distributed/fsdp/_fully_shard/``
    are left out."""
    path = []
    while frame is not None:
        code = frame.f_code
        if _FULLY_SHARD_DIR in code.co_filename and "<locals>" not in code.co_qualname and not is_plumbing(frame):
            path.append(code.co_qualname)
        frame = frame.f_back
    return path[::-1]


class WatchedOrder(list):
    """A ``post_forward_order`` that notes every ``clear()``: who called it (`fully_shard_path`) and how many entries
    it held. Otherwise the list torch had, same entries."""

    def __init__(self, entries: list[Any]) -> None:
        super().__init__(entries)
        self.clears: list[dict[str, Any]] = []

    def clear(self) -> None:
        self.clears.append({"path": fully_shard_path(sys._getframe(1)), "entries": len(self)})
        super().clear()


def watch_order(model: nn.Module) -> WatchedOrder:
    """Swap the root's ``post_forward_order`` for a `WatchedOrder` holding the same entries. The comm context
    creates the list at lazy init (the first forward), and every group reads it through the one shared
    ``comm_ctx``, so call this after a forward has started."""
    state = model._get_fsdp_state()
    groups = [group for each in state._state_ctx.all_states for group in each._fsdp_param_groups]
    watched = WatchedOrder(state._comm_ctx.post_forward_order)
    state._comm_ctx.post_forward_order = watched
    for group in groups:
        require(group.comm_ctx is state._comm_ctx, "comm-ctx-not-shared", f"group {group._module_fqn!r} reads "
                "another comm context than the root's")  # fmt: skip
    return watched


def _path(row: Row) -> list[str]:
    """A ``clear-paths`` row's call path, outermost first: its value's functions, each calling the next (``→``)."""
    return [function.strip() for function in row.value.split("→")]


def _require_clears(
    order: WatchedOrder, since: int, want: list[tuple[list[str], int]], *, lengths: Expected, point: str,
    paths: Expected, path: Row | None = None, **where: Any,
) -> None:  # fmt: skip
    """The clears noted after the first ``since`` are ``want``: (call path, entries held) each. A clear from
    another path than ``path``'s row makes that row false; clears of the right path at the wrong time (or none)
    make the ``lengths`` row of this ``point`` false."""
    seen = [(clear["path"], clear["entries"]) for clear in order.clears[since:]]
    if seen == want:
        return
    stray = path is not None and any(called != _path(path) for called, _ in seen)
    block, row = (paths, path) if stray and path is not None else (lengths, lengths.row(point))
    block.fail(row, "clear-path-differs", f"{point}: clears of the order (path, entries): {seen!r}, expected "
               f"{want!r}", observed=seen, expected=want, **where)  # fmt: skip


def order_cleared_at_step_end(ctx: RankContext, paths: Expected, lengths: Expected) -> dict[str, Any]:
    """mini_gpt under the default settings: the post-forward order is cleared once per step, at the end of the
    backward that is the last one (``is_last_backward``), through the guide's call path; a backward with
    ``set_is_last_backward(False)`` keeps it, so the next forward appends to it. The list's length after each
    forward and backward is the guide's table, which is n + 1 entries per forward since the last clear."""
    automatic = paths.row("automatic")
    path = _path(automatic)
    want = [(row.key, int(row.value)) for row in lengths]
    per_forward, held = len(BLOCKS) + 1, 0
    for row in lengths:
        held = held + per_forward if row.key.startswith("forward") else held if "not last" in row.key else 0
        lengths.require(int(row.value) == held, row, "lengths-differ-from-formula", f"{row.key}: the guide's "
                        f"length {row.value}, against n + 1 entries per forward since the last clear: {held}",
                        observed=int(row.value), expected=held)  # fmt: skip
    model = fsdp2_gpt(ctx, None)
    observed: list[tuple[str, int]] = []
    order: WatchedOrder | None = None
    for label, _ in want:
        if label.startswith("forward"):
            loss = loss_of(ctx, "gpt", model)
            order = order if order is not None else watch_order(model)
            observed.append((label, len(order)))
            continue
        assert order is not None
        last = "not last" not in label
        model.set_is_last_backward(last)
        before, held_before = len(order.clears), len(order)
        loss.backward()
        observed.append((label, len(order)))
        _require_clears(order, before, [(path, held_before)] if last else [], lengths=lengths, point=label,
                        paths=paths, path=automatic if last else None, step=label)  # fmt: skip
    if observed != want:
        first = next(i for i, (seen, stated) in enumerate(zip(observed, want, strict=True)) if seen != stated)
        lengths.fail(lengths.rows[first], "order-length-differs", f"the post-forward order's length: {observed!r}, "
                     f"expected {want!r}", observed=observed, expected=want)  # fmt: skip
    return {
        "lengths": {label: n for label, n in observed},
        "clears": [{"path": " → ".join(clear["path"]), "entries": clear["entries"]} for clear in order.clears],
    }


def manual_finalization_keeps_order(
    ctx: RankContext, paths: Expected, prefetched: Expected, lengths: Expected
) -> dict[str, Any]:  # fmt: skip
    """torch 2.15's ``set_manual_backward_finalization(True)``: backward returns with the post-forward order intact
    and the root's reduce-scatter not issued (its post-backward is left pending by the final callback), with the
    implicit backward prefetches unchanged; ``finalize_backward()`` issues it and clears the order through the
    guide's path. With ``async_op=True`` the order is kept until the handle's ``wait()``, which clears it, and a
    forward before that raises."""
    kept = int(lengths.row("backward, manual").value)
    model = fsdp2_gpt(ctx, None)
    model.set_manual_backward_finalization(True)
    observed: dict[str, int] = {}
    with record_events(model, label="manual finalization, step 1") as events:
        loss = loss_of(ctx, "gpt", model)
        order = watch_order(model)
        with record_comm() as backward_comm:
            loss.backward()
    observed["backward, manual"] = len(order)
    blocks = {"lengths": lengths, "paths": paths}
    _require_clears(order, 0, [], point="backward, manual", **blocks, step=1)
    fetched = prefetches(described(events), phase="backward")
    prefetched.require_rows(fetched, reason="prefetches-differ", what="manual finalization: backward prefetches, "
                            "against the guide's implicit ones", text=arrow, step=1)  # fmt: skip
    scatters = {"backward": sum(c.op == "reduce_scatter" for c in backward_comm)}
    with record_comm() as finalize_comm:
        model.finalize_backward()
    scatters["finalize_backward"] = sum(c.op == "reduce_scatter" for c in finalize_comm)
    observed["finalize_backward"] = len(order)
    want_scatters = {"backward": len(BLOCKS), "finalize_backward": 1}  # the blocks' from autograd; the root's deferred
    require_equal(scatters, want_scatters, reason="reduce-scatters-differ", what="reduce-scatters: one per block in "
                  "backward, the root's in finalize_backward", step=1)  # fmt: skip
    manual = paths.row("manual")
    _require_clears(order, 0, [(_path(manual), kept)], point="finalize_backward", path=manual, **blocks, step=1)

    loss = loss_of(ctx, "gpt", model)
    loss.backward()
    handle = model.finalize_backward(async_op=True)
    observed["finalize_backward, async"] = len(order)
    _require_clears(order, 1, [], point="finalize_backward, async", **blocks, step=2)
    try:
        loss_of(ctx, "gpt", model)
    except RuntimeError as error:
        raised = str(error)
    else:
        raise Violation("forward-before-wait-ran", "a forward before the handle's wait() ran; torch 2.15's "
                        "_pre_forward raises there", step=2)  # fmt: skip
    require("must be waited on before forward" in raised, "forward-raised-otherwise", f"the forward before wait() "
            f"raised {raised!r}", step=2)  # fmt: skip
    handle.wait()
    observed["wait"] = len(order)
    waited = paths.row("async")
    _require_clears(order, 1, [(_path(waited), kept)], point="wait", path=waited, **blocks, step=2)
    lengths.require_values(observed, reason="order-length-differs", what="the post-forward order's length",
                           value=lambda row: int(row.value))  # fmt: skip
    loss = loss_of(ctx, "gpt", model)  # the next step starts on an empty order
    require_equal(len(order), len(BLOCKS) + 1, reason="order-length-differs", what="after the next forward",
                  step=3)  # fmt: skip
    loss.backward()
    model.finalize_backward()
    return {
        "lengths": observed,
        "reduce_scatters": scatters,
        "backward_prefetches": fetched,
        "forward_before_wait": raised,
        "clears": [{"path": " → ".join(clear["path"]), "entries": clear["entries"]} for clear in order.clears],
    }
