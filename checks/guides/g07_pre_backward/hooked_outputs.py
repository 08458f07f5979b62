"""Registered on the outputs that require grad: after forward, each unit output that requires grad carries one
pre-backward hook bound to its unit; a unit with none such is not marked for a pre-backward unshard, and its
hook never runs in backward."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from checks.expected import Expected, Row
from checks.guides.g07_pre_backward.backward_observer import observe_backward
from checks.naming import ROOT
from checks.ranks.context import RankContext
from checks.violation import require_equal
from checks.workloads.fan_out import fan_out, fan_out_batch, fan_out_loss
from checks.workloads.gpt import units


def _hook_marks(tensor: torch.Tensor, unit: FSDP, all_units: dict[str, FSDP]) -> str:
    """``hooked`` when the tensor carries exactly one `_pre_backward_hook`, bound to ``unit`` and its handle;
    ``none`` without one; otherwise what it carries."""
    hooks = [
        h
        for h in (tensor._backward_hooks or {}).values()
        if isinstance(h, functools.partial) and getattr(h.func, "__name__", "") == "_pre_backward_hook"
    ]
    if not hooks:
        return "none"
    owners = sorted({next((n for n, u in all_units.items() if u is h.args[0]), "?") for h in hooks})
    own = all(h.args[0] is unit and h.args[2] is unit._handle for h in hooks)
    if len(hooks) == 1 and own:
        return "hooked"
    return f"hooked {len(hooks)}× by {', '.join(owners)}"


def _marks(row: Row) -> list[str]:
    """A ``hooked-outputs`` row's marks, one per output in the order the unit returns them."""
    return row.value.split()


def hooks_on_grad_outputs(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """After forward, exactly the unit outputs that require grad carry one pre-backward hook bound to their unit
    (``expected``: per unit, per output, ``hooked`` or ``none``, from the model's structure); a unit with none
    such has ``_needs_pre_backward_unshard`` False and gets no pre-backward call in backward."""
    stated = {row.key: _marks(row) for row in expected}
    model = fan_out(ctx)
    all_units = units(model)
    outputs = model(fan_out_batch(ctx))
    produced = {**model.module.outputs, ROOT: outputs}
    hooked = {unit: [_hook_marks(t, all_units[unit], all_units) for t in produced[unit]] for unit in stated}
    requires_grad = {unit: [t.requires_grad for t in produced[unit]] for unit in stated}
    what = "pre-backward hooks on each unit's outputs"
    expected.require_values(hooked, reason="hooked-outputs", what=what, value=_marks)
    follows_rule = {unit: [mark == "hooked" for mark in marks] for unit, marks in hooked.items()}
    require_equal(
        follows_rule, requires_grad, reason="hooked-not-requires-grad", what="hooked outputs vs requires_grad"
    )
    needs = {unit: all_units[unit]._handle._needs_pre_backward_unshard for unit in stated}
    expected.require_values(needs, reason="needs-unshard-flag", what="`_needs_pre_backward_unshard` after forward",
                            value=lambda row: "hooked" in _marks(row))  # fmt: skip
    with observe_backward(model) as log:
        fan_out_loss(outputs).backward()
    called = sorted({call.unit for call in log.calls})
    want_called = sorted(unit for unit, marks in stated.items() if "hooked" in marks)
    # False on each row whose unit ran its hook without a hooked output, or had one and did not.
    off = [row for row in expected if (row.key in called) != (row.key in want_called)]
    message = f"units whose pre-backward hook ran: {called!r}, expected {want_called!r}"
    expected.require(called == want_called, off, "pre-backward-units", message, observed=called, expected=want_called)
    return {
        "hooked": hooked,
        "requires_grad": requires_grad,
        "needs_pre_backward_unshard": needs,
        "units_with_pre_backward": called,
    }
