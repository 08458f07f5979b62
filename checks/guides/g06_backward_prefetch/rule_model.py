"""The rule model predicts a whole backward: every pre-backward hook, post-backward hook and prefetch, in order,
from the workload's post-forward order alone, for each mode (`checks.models.prefetch.backward_sequence`)."""

from __future__ import annotations

from checks.guides.g06_backward_prefetch.backward_runs import (
    MODES,
    PARENTS,
    POST_FORWARD,
    build,
    hook_sequence,
    label,
    loss_of,
    recorded_post_forward,
)
from checks.models.prefetch import backward_sequence
from checks.probes.events import record_events
from checks.probes.expect import assert_sequence
from checks.ranks.context import RankContext
from checks.violation import Violation, require_equal


def model_predicts_backward(ctx: RankContext, workload: str) -> dict[str, dict[str, list[str]]]:
    """For each mode, the backward's pre_backward / post_backward / prefetch sequence equals what the rule model
    (`backward_sequence`) predicts from the workload's structural post-forward order (and, for nested units, which
    unit encloses which); torch's own record of that order is checked first, so the model's input is right."""
    post_forward = POST_FORWARD[workload]
    out = {}
    for mode in MODES:
        model = build(ctx, workload, mode)
        loss = loss_of(ctx, workload, model)
        order, _ = recorded_post_forward(model)
        what = f"{workload} {label(mode)}: torch's post-forward record"
        require_equal(order, list(post_forward), reason="post-forward-order", what=what, mode=label(mode))
        with record_events(model) as events:
            loss.backward()
        observed = hook_sequence(events)
        expected = backward_sequence(post_forward, mode, parents=PARENTS.get(workload))
        what = f"{workload} {label(mode)}: backward hooks and prefetches"
        try:
            assert_sequence(observed, expected, what=what, reason="sequence-differs")
        except Violation as failure:
            failure.details["mode"] = label(mode)
            raise
        out[label(mode)] = {"sequence": observed, "prefetches": [e.removeprefix("prefetch ") for e in observed
                                                                 if e.startswith("prefetch")]}  # fmt: skip
    return out
