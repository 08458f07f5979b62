"""Torch's post-forward record, which backward prefetch reads: a unit used twice in one forward (the index-0
truth test in ``record_post_forward``), and the record in an eval-only loop, which grows until a training step's
final callback clears it. Expected records come from `checks.models.prefetch.post_forward_record`."""

from __future__ import annotations

from typing import Any

import torch

from checks.expected import Expected
from checks.guides.g06_backward_prefetch.backward_runs import (
    MODES,
    POST_FORWARD,
    hook_sequence,
    label,
    model_prefetches,
    policy,
    recorded_post_forward,
)
from checks.models.prefetch import backward_sequence_of_uses, post_forward_record
from checks.naming import ROOT
from checks.probes.events import record_events
from checks.probes.expect import assert_sequence
from checks.ranks.context import RankContext
from checks.violation import Violation, require, require_equal
from checks.workloads.gpt import batch, fsdp1_gpt
from checks.workloads.reorderable import ReorderableGPT

REUSE_ORDERS = {"first unit reused": [0, 1, 0, 2], "another unit reused": [0, 1, 2, 1]}


def first_unit_reused(ctx: RankContext) -> dict[str, Any]:
    """A forward that runs a block twice: torch's post-forward record and indices are `post_forward_record`'s,
    where the unit at index 0 takes the index of its second use and any other unit keeps its first; each mode's
    backward is `backward_sequence_of_uses`'s. With blocks 0, 1, 0, 2 under BACKWARD_PRE that differs from what
    an ``is not None`` test would give: blocks.0 prefetches blocks.1."""
    out: dict[str, Any] = {}
    for scenario, blocks in REUSE_ORDERS.items():
        uses = [*(f"blocks.{i}" for i in blocks), ROOT]
        record, index = post_forward_record(uses)
        for mode in MODES:
            model = fsdp1_gpt(ctx, backward_prefetch=policy(mode), model_class=ReorderableGPT)
            model._fsdp_wrapped_module.blocks.order = blocks
            _, loss = model(*batch(ctx))
            got_record, got_index = recorded_post_forward(model)
            where = {"scenario": scenario, "mode": label(mode)}
            require_equal(
                {"record": got_record, "index": got_index}, {"record": record, "index": index},
                reason="record-differs", what=f"{scenario}: torch's post-forward record", **where,
            )  # fmt: skip
            with record_events(model) as events:
                loss.backward()
            observed = hook_sequence(events)
            try:
                assert_sequence(
                    observed, backward_sequence_of_uses(uses, mode), what=scenario, reason="sequence-differs"
                )
            except Violation as failure:
                failure.details.update(where)
                raise
            first_use_rule = backward_sequence_of_uses(uses, mode, zero_is_falsy=False)
            prefetches = [e.removeprefix("prefetch ") for e in observed if e.startswith("prefetch")]
            out[f"{scenario} {label(mode)}"] = {"prefetches": prefetches, "as_is_not_none": observed != first_use_rule}
        out[scenario] = {"record": record, "index": index}
    differs = out[f"first unit reused {label('BACKWARD_PRE')}"]["as_is_not_none"]
    require(differs, "quirk-not-visible", "blocks 0, 1, 0, 2 under BACKWARD_PRE behave as an `is not None` test would")
    return out


def eval_record_grows(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """Forwards in eval under no_grad, with no backward: every forward appends each unit to
    ``handles_post_forward_order`` again, so its length after k forwards is the guide's (4k, a row per k), as
    `post_forward_record` gives for k forwards without a reset. A training step then clears it at the final
    callback, and its backward prefetches as usual."""
    rows = {int(row.key): row for row in expected}
    model = fsdp1_gpt(ctx)
    model.eval()
    lengths: dict[str, int] = {}
    with torch.no_grad():
        for k in range(1, max(rows) + 1):
            model(batch(ctx, step=k)[0])
            order, index = recorded_post_forward(model)
            record, want_index = post_forward_record(list(POST_FORWARD["gpt"]) * k)
            # Against the model's record, whose length the guide's row for k states: another length makes it false.
            message = f"the record after {k} forwards: {len(order)}, expected {len(record)}"
            expected.require(len(order) == len(record), rows.get(k, ()), "record-length", message,
                             observed=len(order), expected=len(record))  # fmt: skip
            require_equal(index, want_index, reason="index-differs", what=f"the indices after {k} forwards")
            lengths[str(k)] = len(order)
    expected.require_values(lengths, reason="record-length", what="the record's length by forwards, vs the guide",
                            value=lambda row: int(expected.cells(row)["length"]))  # fmt: skip
    indices_after_eval = recorded_post_forward(model)[1]
    model.train()
    _, loss = model(*batch(ctx))
    with record_events(model) as events:
        loss.backward()
    after = len(model._exec_order_data.handles_post_forward_order)
    require_equal(after, 0, reason="not-cleared", what="the record's length after a training step")
    prefetches = [f"{e.unit}→{e.target}" for e in events.select("prefetch")]
    expected_prefetches = model_prefetches(POST_FORWARD["gpt"], "BACKWARD_PRE")
    require_equal(
        prefetches, expected_prefetches, reason="prefetch-order", what="the training step's prefetches after eval"
    )
    return {"lengths": lengths, "indices": indices_after_eval, "after_training_step": after, "prefetches": prefetches}
