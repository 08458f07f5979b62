"""Several forwards before backward: the post-forward order holds one entry per use, and each case's step, its
all-gathers and reduce-scatters are the rule model's with ``forwards=2``, and the counts the guide's table."""

from __future__ import annotations

from typing import Any

from checks.expected import Expected
from checks.guides.g17_fsdp2_prefetch.steps import (
    FORWARD,
    NO_INPUT_GRAD,
    build,
    described,
    gathers_of,
    loss_of,
    matches_model,
    torch_post_forward_order,
)
from checks.models.fsdp2_prefetch import all_gathers, prefetches, step_sequence
from checks.naming import ROOT
from checks.probes.comm import record_comm
from checks.probes.events import record_events
from checks.ranks.context import RankContext
from checks.violation import require_equal

# Each case is (workload, reshard_after_forward, the forwards each backward covers in call order, each backward's
# is_last_backward); every case runs two forwards.
SEVERAL_FORWARDS: dict[str, tuple[str, bool | None, list[list[int]], list[bool]]] = {
    "one backward": ("gpt", None, [[1, 2]], [True]),
    "two backwards": ("gpt", None, [[2], [1]], [True, True]),
    "two, the first not last": ("gpt", None, [[2], [1]], [False, True]),
    "False, one backward": ("gpt", False, [[1, 2]], [True]),
    "toy, one backward": ("toy", None, [[1, 2]], [True]),
}


SEVERAL_FORWARDS_COLUMNS = ("forward", "backward", "prefetched", "post_backwards", "reduce_scatters")


def several_forwards_row(sequence: list[str], gathers: dict[str, int], reduce_scatters: int) -> list[int]:
    """One row of ``expect several-forwards`` after its case: all-gathers in forward and in backward, the
    backward's prefetches, post-backward hooks run, reduce-scatters."""
    post_backwards = sum(e.startswith("post_backward ") for e in sequence)
    prefetched = len(prefetches(sequence, phase="backward"))
    return [gathers["forward"], gathers["backward"], prefetched, post_backwards, reduce_scatters]


def several_forwards(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """Two forwards before backward, for each case of `SEVERAL_FORWARDS`: torch's post-forward order holds one
    entry per use; the whole event sequence is `step_sequence`'s with ``forwards=2`` and the case's backwards, and
    the recorder's all-gathers (forward, backward) and reduce-scatters are that sequence's counts. Each case's
    row is the guide's, from the model first and then from the run."""
    unknown = [row for row in expected if row.key not in SEVERAL_FORWARDS]
    expected.require(sorted(expected.keys) == sorted(SEVERAL_FORWARDS), unknown, "cases-differ-from-guide",
                     f"the cases: {sorted(expected.keys)!r}, the check's {sorted(SEVERAL_FORWARDS)!r}",
                     observed=sorted(expected.keys), expected=sorted(SEVERAL_FORWARDS))  # fmt: skip
    out: dict[str, Any] = {}
    for case, (workload, reshard, backwards, last) in SEVERAL_FORWARDS.items():
        row = expected.row(case)
        stated = [int(cell) for cell in row.cells[1:]]
        where = {"case": case}
        forward = FORWARD[workload]
        sequence = step_sequence(
            forward, ROOT, reshard_after_forward=reshard, no_input_grad=NO_INPUT_GRAD[workload], forwards=2,
            backwards=backwards, last_backward=last,
        )  # fmt: skip
        modelled = several_forwards_row(
            sequence, all_gathers(sequence), sum(e.startswith("reduce_grad ") for e in sequence)
        )
        expected.require(modelled == stated, row, "model-differs-from-guide", f"{case}: the model {modelled!r}, "
                         f"the guide's row {stated!r}", observed=modelled, expected=stated, **where)  # fmt: skip
        model = build(ctx, workload, reshard)
        with record_events(model, label=f"two forwards, {case}") as events:
            with record_comm() as forward_comm:
                losses = [loss_of(ctx, workload, model, step) for step in (1, 2)]
            order = torch_post_forward_order(model)
            with record_comm() as backward_comm:
                for covered, is_last in zip(backwards, last, strict=True):
                    model.set_is_last_backward(is_last)
                    sum(losses[number - 1] for number in covered).backward()
        require_equal(order, [*forward, ROOT] * 2, reason="post-forward-order", what=f"{case}: torch's post-forward "
                      "order, one entry per use", **where)  # fmt: skip
        gathers = gathers_of(forward_comm, backward_comm)
        step = {"sequence": described(events), "expected": sequence, "all_gathers": gathers, "where": where}
        matches_model(step)
        reduce_scatters = sum(c.op == "reduce_scatter" for c in backward_comm)
        require_equal(reduce_scatters, modelled[-1], reason="reduce-scatters", what=f"{case}: reduce-scatters "
                      "recorded, against the model's", **where)  # fmt: skip
        observed = several_forwards_row(step["sequence"], gathers, reduce_scatters)
        expected.require(observed == stated, row, "several-differs-from-guide", f"{case}: the run {observed!r}, "
                         f"the guide's row {stated!r}", observed=observed, expected=stated, **where)  # fmt: skip
        out[case] = dict(zip(SEVERAL_FORWARDS_COLUMNS, observed, strict=True))
    return out
