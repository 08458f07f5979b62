"""The root queues the final callback once per backward, whatever its hook's call count, and only the root's
hook queues it: a backward that reaches none of the root's outputs runs no final callback."""

from __future__ import annotations

from typing import Any

from checks.guides.g07_pre_backward.backward_observer import observe_backward
from checks.naming import ROOT
from checks.ranks.context import RankContext
from checks.violation import require_equal
from checks.workloads.fan_out import fan_out, fan_out_batch, fan_out_loss
from checks.workloads.gpt import units

ROOT_OUTPUTS = 2  # FanOut returns two tensors that require grad, both in the loss


def final_callback_queued_once(ctx: RankContext) -> dict[str, Any]:
    """For a root with parameters and one without: its pre-backward hook runs once per output (two), yet autograd's
    ``queue_callback`` is called once and the final callback runs once; the root's ``_post_backward_callback_queued``
    is False after forward, True when the callback starts and False again after backward; only the root has it."""
    seen: dict[str, Any] = {}
    for label, head in (("with parameters", True), ("without parameters", False)):
        model = fan_out(ctx, head=head)
        require_equal(model._handle is not None, head, reason="root-handle", what=f"root {label}: has a handle")
        loss = fan_out_loss(model(fan_out_batch(ctx)))
        after_forward = model._post_backward_callback_queued
        on_non_root = sorted(
            u for u, m in units(model).items() if u != ROOT and hasattr(m, "_post_backward_callback_queued")
        )
        with observe_backward(model) as log:
            loss.backward()
        after_backward = model._post_backward_callback_queued
        root_calls = [call for call in log.calls if call.unit == ROOT]
        observed = {
            "root_calls": len(root_calls),
            "past_guard": sum(call.passed for call in root_calls),
            "queue_callback": log.queue_callbacks,
            "final_callback_runs": len(log.final_callbacks),
            "registrations": [(r["before"], r["after"]) for r in log.registrations],
            "flag": {
                "after forward": after_forward,
                "in callback": log.final_callbacks,
                "after backward": after_backward,
            },
        }
        what = f"root {label}"
        require_equal(
            observed["root_calls"],
            ROOT_OUTPUTS,
            reason="root-pre-backward-calls",
            what=f"{what}: the root's `_pre_backward_hook` calls",
            variant=label,
        )
        require_equal(
            log.queue_callbacks,
            1,
            reason="queue-callback-calls",
            what=f"{what}: `queue_callback` calls in one backward",
            variant=label,
            final_callback_runs=len(log.final_callbacks),
        )
        require_equal(
            len(log.final_callbacks),
            1,
            reason="final-callback-runs",
            what=f"{what}: final callback runs",
            variant=label,
            queue_callback=log.queue_callbacks,
        )
        require_equal(
            observed["registrations"],
            [(False, True)],
            reason="registrations",
            what=f"{what}: `_register_post_backward_final_callback` calls, (flag on entry, flag on return)",
            variant=label,
        )
        require_equal(
            observed["flag"],
            {"after forward": False, "in callback": [True], "after backward": False},
            reason="queued-flag",
            what=f"{what}: `_post_backward_callback_queued`",
            variant=label,
        )
        require_equal(on_non_root, [], reason="flag-off-root", what=f"{what}: non-root units with the flag")
        seen[label] = observed
    return seen


def no_callback_without_root_output(ctx: RankContext) -> dict[str, Any]:
    """A backward from ``pair``'s second output alone reaches none of the root's outputs: only ``pair``'s hook runs
    (once: its first output is not in the loss), ``queue_callback`` is never called, no final callback runs, and
    ``pair`` is left in ``FORWARD_BACKWARD`` with nothing to reset it."""
    model = fan_out(ctx)
    model(fan_out_batch(ctx))
    b = model.module.outputs["pair"][1]
    with observe_backward(model) as log:
        b.sum().backward()
    all_units = units(model)
    passed = log.per_unit("passed")
    calls = {unit: len(passed.get(unit, [])) for unit in all_units}
    want_calls = {unit: int(unit == "pair") for unit in all_units}
    require_equal(calls, want_calls, reason="pre-backward-calls", what="`_pre_backward_hook` calls per unit")
    require_equal(
        log.queue_callbacks,
        0,
        reason="queue-callback-calls",
        what="`queue_callback` calls in a backward that reaches no root output",
        final_callback_runs=len(log.final_callbacks),
    )
    require_equal(len(log.final_callbacks), 0, reason="final-callback-runs", what="final callback runs")
    left = {unit: m.training_state.name for unit, m in all_units.items()}
    want_left = {unit: "FORWARD_BACKWARD" if unit == "pair" else "IDLE" for unit in all_units}
    require_equal(left, want_left, reason="left-in-backward", what="training states after backward")
    return {
        "calls": calls,
        "queue_callback": log.queue_callbacks,
        "final_callback_runs": len(log.final_callbacks),
        "training_state": left,
    }
