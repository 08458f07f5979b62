"""Once per handle per backward: autograd calls a unit's `_pre_backward_hook` once per output that requires grad
and reaches the loss, in the order it reaches them; only the first call gets past the guard and does the work."""

from __future__ import annotations

from typing import Any

from checks.expected import Expected
from checks.guides.g07_pre_backward.backward_observer import observe_backward
from checks.ranks.context import RankContext
from checks.violation import require_equal
from checks.workloads.fan_out import fan_out, fan_out_batch, fan_out_loss


def hook_works_once_per_backward(ctx: RankContext, expected: Expected, iterations: int = 2) -> dict[str, Any]:
    """In each of ``iterations`` forward/backward steps, autograd calls each unit's `_pre_backward_hook` once per
    output tensor that requires grad and reaches the loss (``expected``: the guide's counts, from the model's
    structure, its rows in the order of the calls); only the unit's first call gets past the
    ``_ran_pre_backward_hook`` guard, and that call prepares the handle's gradient."""
    want_calls = {unit: int(n) for unit, n in expected.column("calls").items()}
    past = {unit: int(n) for unit, n in expected.column("past the guard").items()}
    want_passed = {unit: [True] * past[unit] + [False] * (calls - past[unit]) for unit, calls in want_calls.items()}
    # The block's rows are in call order: autograd runs the ready node created last first, so the root's outputs
    # come first, then `mixed`'s, then `pair`'s (whose `b` also feeds `mixed`).
    want_order = [unit for unit, calls in want_calls.items() for _ in range(calls)]
    model = fan_out(ctx)
    seen: dict[str, Any] = {}
    for step in range(iterations):
        loss = fan_out_loss(model(fan_out_batch(ctx, step)))
        with observe_backward(model) as log:
            loss.backward()
        label = f"iteration {step + 1}"
        passed, prepared = log.per_unit("passed"), log.per_unit("prepared")
        calls = {unit: len(passed.get(unit, [])) for unit in want_calls}
        what = f"{label}: `_pre_backward_hook` calls per unit"
        expected.require_values(calls, reason="pre-backward-calls", what=what, value=lambda row: want_calls[row.key])
        got_passed = {unit: passed.get(unit, []) for unit in want_calls}
        what = f"{label}: which calls got past the `_ran_pre_backward_hook` guard, per unit"
        expected.require_values(got_passed, reason="pre-backward-work", what=what,
                                value=lambda row: want_passed[row.key])  # fmt: skip
        require_equal(
            {unit: prepared.get(unit, []) for unit in want_calls},
            got_passed,
            reason="per-handle-work",
            what=f"{label}: which calls prepared the handle's gradient, per unit",
        )
        order = [call.unit for call in log.calls]
        if order != want_order:
            # False on the row whose unit the first call out of place should have been.
            pairs = enumerate(zip(order, want_order, strict=False))
            first = next((i for i, (got, want) in pairs if got != want), min(len(order), len(want_order)))
            rows = [expected.row(want_order[min(first, len(want_order) - 1)])] if want_order else []
            message = f"{label}: `_pre_backward_hook` calls in order: {order!r}, expected {want_order!r}"
            expected.fail(rows, "pre-backward-order", message, observed=order, expected=want_order)
        seen.setdefault("calls", calls)
        seen.setdefault("past_guard", {unit: sum(flags) for unit, flags in got_passed.items()})
        seen.setdefault("order", order)
    seen["iterations"] = iterations
    return seen
