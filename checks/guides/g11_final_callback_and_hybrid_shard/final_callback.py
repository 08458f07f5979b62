"""Guide 11's end of backward: the final callback's resets (expect `resets`), the execution record's next
iteration, and `_finalize_params` handing the reduced shard to ``.grad``."""

from __future__ import annotations

import types
from typing import Any

from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from checks.expected import Expected
from checks.guides.g11_final_callback_and_hybrid_shard.observing import FINAL_CALLBACK, FINALIZE, observing, unit_names
from checks.models.flat_param import layout
from checks.naming import ROOT
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.gpt import POST_FORWARD, batch, fsdp1_gpt, unit_numels, units

# -- claim: every state IDLE after backward ----------------------------------------------------------------------
HANDLE_FIELDS = ("_training_state", "_ran_pre_backward_hook", "_needs_pre_backward_unshard", "_post_forward_index",
                 "_prefetched")  # fmt: skip


def _text(value: Any) -> str:
    """A value as the guide's expect block writes it: an enum member by name, anything else by repr."""
    return value.name if hasattr(value, "name") else repr(value)


def _unit_fields(unit: FSDP) -> dict[str, str]:
    fields = {"training_state": _text(unit.training_state)}
    fields.update({name: _text(getattr(unit._handle, name)) for name in HANDLE_FIELDS})
    return fields


def idle_after_backward(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """After a backward every unit's state and handle hold the values the final callback assigns (the guide's
    expect block, ``<field>: <value>`` per row), and the root's ``_post_backward_callback_queued`` is False. The
    callback, observed as it starts, must find the training states, ``_ran_pre_backward_hook``,
    ``_post_forward_index`` and the queued flag at other values, so it is the callback that resets them."""
    queued_row = expected.row("_post_backward_callback_queued")
    want = {row.key: row.value for row in expected if row is not queued_row}
    model = fsdp1_gpt(ctx)
    names = unit_names(model)
    before: dict[str, dict[str, str]] = {}

    def on_final(frame: types.FrameType) -> None:
        state = frame.f_locals["state"]
        before[ROOT] = {"_post_backward_callback_queued": _text(state._post_backward_callback_queued)}
        for unit in state._all_fsdp_states:
            before.setdefault(names[id(unit)], {}).update(_unit_fields(unit))

    _, loss = model(*batch(ctx))
    with observing({FINAL_CALLBACK: on_final}):
        loss.backward()
    after = {name: _unit_fields(unit) for name, unit in units(model).items()}
    stated = dict.fromkeys(after, want)
    # The rows some unit does not hold; none when the fields read are not the fields the block states.
    wrong = [row for row in expected if row.key in want and any(f.get(row.key) != row.value for f in after.values())]
    expected.require(after == stated, wrong, "not-reset", f"unit fields after backward: {after!r}, expected "
                     f"{stated!r}", observed=after, expected=stated)  # fmt: skip
    root_queued = _text(model._post_backward_callback_queued)
    expected.require(root_queued == queued_row.value, queued_row, "callback-still-queued",
                     f"root._post_backward_callback_queued: {root_queued!r}, expected {queued_row.value!r}",
                     observed=root_queued, expected=queued_row.value)  # fmt: skip
    require(before, "no-final-callback", "the final callback never ran", observed=before)
    # The fields an ordinary step leaves at other values: the callback's resets are what this claim sees.
    changed = ("training_state", "_training_state", "_ran_pre_backward_hook", "_post_forward_index")
    same = {name: [f for f in changed if fields[f] == want[f]] for name, fields in before.items()}
    require(not any(same.values()), "already-reset", f"already at their reset values when the callback started: "
            f"{same}", observed=same)  # fmt: skip
    require_equal(before[ROOT]["_post_backward_callback_queued"], "True", reason="queued-not-set",
                  what="root._post_backward_callback_queued when the callback starts")  # fmt: skip
    return {"before": before, "after": after, "root_queued": root_queued}


# -- claim: next_iter clears the post-forward order ------------------------------------------------------------
# The order the units' pre-forwards run in, so the order iteration 1 records: the root's forward starts first.
PRE_FORWARD = (ROOT, "blocks.0", "blocks.1", "blocks.2")


def _order(model: FSDP, handles: list[Any]) -> list[str]:
    by_handle = {id(u._handle): name for name, u in units(model).items()}
    return [by_handle[id(h)] for h in handles]


def next_iter_clears_post_forward_order(ctx: RankContext, iterations: int = 2) -> dict[str, Any]:
    """Each forward records the post-forward order (guide 06's); each backward's final callback clears it and
    counts one iteration. The pre-forward order, recorded in iteration 1 only, is kept. All units share one
    record."""
    model = fsdp1_gpt(ctx)
    seen: dict[str, Any] = {}
    for it in range(1, iterations + 1):
        _, loss = model(*batch(ctx, step=it - 1))
        eod = model._exec_order_data
        shared = {name: u._exec_order_data is eod for name, u in units(model).items()}
        require_equal(shared, dict.fromkeys(shared, True), reason="record-not-shared", what="units sharing the root's "
                      "execution-order record")  # fmt: skip
        for moment in ("after forward", "after backward"):
            if moment == "after backward":
                loss.backward()
            observed = {
                "post_forward": _order(model, eod.handles_post_forward_order),
                "pre_forward": _order(model, eod.handles_pre_forward_order),
                "iter": eod._iter,
            }
            want = {
                "post_forward": list(POST_FORWARD) if moment == "after forward" else [],
                "pre_forward": list(PRE_FORWARD),
                "iter": it - 1 if moment == "after forward" else it,
            }
            where = f"iteration {it}, {moment}"
            reasons = {"post_forward": "post-forward-order", "pre_forward": "pre-forward-order", "iter": "iteration"}
            for key, reason in reasons.items():
                require_equal(observed[key], want[key], reason=reason, what=f"{where}: {key}", iteration=it,
                              moment=moment)  # fmt: skip
            seen[where] = {**observed, "post_forward_count": len(observed["post_forward"])}
    return seen


# -- claim: _finalize_params moves the sharded gradient to .grad -----------------------------------------------
def _grad_state(unit: FSDP) -> dict[str, Any]:
    flat = unit._handle.flat_param
    saved = getattr(flat, "_saved_grad_shard", None)
    views = [p.grad.untyped_storage().data_ptr() for p in flat._params if p.grad is not None]
    return {
        "grad": flat.grad,
        "saved": saved,
        "has_saved": hasattr(flat, "_saved_grad_shard"),
        "post_backward_called": flat._post_backward_called,
        "view_storages": sorted(set(views)),
    }


def finalize_moves_shard_to_grad(ctx: RankContext) -> dict[str, Any]:
    """Observed as each unit's `_finalize_params` starts, and after backward: it enters with ``.grad`` None, the
    reduced shard in ``_saved_grad_shard`` (of the layout model's shard length) and ``_post_backward_called``
    True; it leaves that same tensor as ``.grad`` (no copy), ``_saved_grad_shard`` gone and
    ``_post_backward_called`` False. The original parameters' gradients are views into it throughout."""
    model = fsdp1_gpt(ctx)
    names = unit_names(model)
    shard = {name: layout(numels, 4, ctx.world_size).shard_numel for name, numels in unit_numels().items()}
    seen: dict[str, dict[str, Any]] = {}

    def on_finalize(frame: types.FrameType) -> None:
        unit = frame.f_locals["state"]
        seen[names[id(unit)]] = {"before": _grad_state(unit)}

    _, loss = model(*batch(ctx))
    with observing({FINALIZE: on_finalize}):
        loss.backward()
    for name, unit in units(model).items():  # nothing after `_finalize_params` touches the gradient
        seen.get(name, {})["after"] = _grad_state(unit)
    require_equal(sorted(seen), sorted(shard), reason="not-finalized", what="units through _finalize_params")
    report = {}
    for name, s in seen.items():
        before, after = s["before"], s["after"]
        saved = before["saved"]
        observed = {
            "before": {"grad": before["grad"] is not None, "saved_numel": saved.numel() if saved is not None else None,
                       "post_backward_called": before["post_backward_called"]},
            "after": {"grad_is_saved_shard": after["grad"] is saved and saved is not None,
                      "has_saved": after["has_saved"], "post_backward_called": after["post_backward_called"]},
        }  # fmt: skip
        want = {
            "before": {"grad": False, "saved_numel": shard[name], "post_backward_called": True},
            "after": {"grad_is_saved_shard": True, "has_saved": False, "post_backward_called": False},
        }
        for moment, reason in (("before", "not-reduced-before-finalize"), ("after", "grad-not-moved")):
            require_equal(observed[moment], want[moment], reason=reason, what=f"{name} {moment} _finalize_params",
                          unit=name)  # fmt: skip
        storage = after["grad"].untyped_storage().data_ptr()
        views = {"before": before["view_storages"], "after": after["view_storages"]}
        require_equal(views, {"before": [storage], "after": [storage]}, reason="grad-views-elsewhere",
                      what=f"{name}: storages of the original parameters' gradients", unit=name)  # fmt: skip
        report[name] = observed
    return report
