"""Which hook prefetches which group: none in forward without targets, the entry before in the post-forward order
in backward, exactly the targets given when they are set, and the order of the step being run."""

from __future__ import annotations

from typing import Any

from checks.expected import Expected
from checks.guides.g17_fsdp2_prefetch.steps import (
    BLOCKS,
    FORWARD,
    RESHARD,
    arrow,
    matches_model,
    one_step,
    run_step,
    set_targets,
)
from checks.models.fsdp2_prefetch import lookahead, prefetches, step_sequence
from checks.naming import ROOT
from checks.ranks.context import RankContext
from checks.violation import require_equal
from mini_gpt import preset


def _require_row(expected: Expected, key: str, observed: list[str], *, reason: str, what: str, **details: Any) -> None:
    """A mapping row's prefetches (the words of its value) against ``observed``, failing on that row."""
    row = expected.row(key)
    stated = row.value.split()
    expected.require(observed == stated, row, reason, f"{what}: {observed!r}, expected {stated!r}",
                     observed=observed, expected=stated, **details)  # fmt: skip


def no_implicit_forward_prefetch(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """With no explicit targets, no forward prefetches, in the first step or the second: every group's all-gather
    is issued by its own pre-forward (``unshard`` events, in the guide's order); the whole step is the model's."""
    steps = one_step(ctx, "gpt", True, steps=2)
    out: dict[str, Any] = {}
    for number, step in enumerate(steps, start=1):
        seq = step["sequence"]
        forward = seq[: seq.index(f"pre_backward {ROOT}")] if f"pre_backward {ROOT}" in seq else seq
        issued = [e.removeprefix("unshard ") for e in forward if e.startswith("unshard ")]
        fetched = prefetches(forward)
        require_equal(fetched, [], reason="forward-prefetched", what=f"step {number}: prefetches in forward",
                      step=number)  # fmt: skip
        expected.require_rows(issued, reason="forward-differs", what=f"step {number}: groups unsharded by their "
                              "own pre-forward, against the guide", step=number)  # fmt: skip
        matches_model(step)
        out[str(number)] = {"forward_prefetches": len(fetched), "own_unshards": issued}
    out["forward_prefetches"] = sum(out[k]["forward_prefetches"] for k in ("1", "2"))
    return out


def implicit_backward_prefetch(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """With no explicit targets each group's pre-backward prefetches the entry before its own in the post-forward
    order: mini_gpt and the toy, with ``reshard_after_forward`` True and the default (the root kept unsharded);
    mini_gpt's backward prefetches are the guide's, and the whole step is the rule model's."""
    model_pairs = prefetches(step_sequence(BLOCKS, ROOT), phase="backward")
    expected.require_rows(model_pairs, reason="order-differs-from-guide", what="the model's prefetches", text=arrow)
    toy_pairs = prefetches(step_sequence(FORWARD["toy"], ROOT), phase="backward")
    out: dict[str, Any] = {}
    for workload in ("gpt", "toy"):
        for label in ("True", "None"):
            (step,) = one_step(ctx, workload, RESHARD[label])
            fetched = prefetches(step["sequence"], phase="backward")
            what = f"{workload} {label}: backward prefetches"
            if workload == "gpt":  # the guide's block
                expected.require_rows(fetched, reason="prefetches-differ", what=what, text=arrow, workload=workload,
                                      reshard=label)  # fmt: skip
            else:  # the toy's are the model's
                require_equal(fetched, toy_pairs, reason="prefetches-differ", what=what, workload=workload,
                              reshard=label)  # fmt: skip
            matches_model(step)
            out[f"{workload} {label}"] = {"prefetches": fetched, "post_forward": step["post_forward"]}
    return out


def explicit_forward_prefetch(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """``set_modules_to_forward_prefetch`` with a lookahead of 1 and of 2 (each block names the next k blocks):
    the forward prefetches are the guide's rows, and the step is the model's."""
    out: dict[str, Any] = {}
    series: dict[str, Any] = {}
    for k in (1, 2):
        targets = lookahead(BLOCKS, ROOT, k, "forward")
        modelled = prefetches(step_sequence(BLOCKS, ROOT, forward_targets=targets), phase="forward")
        _require_row(expected, f"lookahead-{k}", modelled, reason="order-differs-from-guide",
                     what=f"model, lookahead {k}")  # fmt: skip
        (step,) = one_step(ctx, "gpt", True, forward_targets=targets)
        fetched = prefetches(step["sequence"], phase="forward")
        _require_row(expected, f"lookahead-{k}", fetched, reason="prefetches-differ", what=f"forward lookahead {k}",
                     lookahead=k)  # fmt: skip
        matches_model(step)
        out[f"lookahead {k}"] = {"targets": targets, "forward_prefetches": fetched}
        series[f"lookahead {k}"] = step["memory"]  # `fsdp-readings memory`: a deeper lookahead holds more
    return {**out, "series": series}


BACKWARD_CASES = {
    "lookahead-1": lookahead(BLOCKS, ROOT, 1, "backward"),
    "lookahead-2": lookahead(BLOCKS, ROOT, 2, "backward"),
    "root-to-blocks.0": {ROOT: ["blocks.0"]},
}


def explicit_backward_prefetch(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """``set_modules_to_backward_prefetch`` with a lookahead of 1 and of 2 (the root and each block name the k
    units before them in post-forward order), and one target that is not the implicit one (the root names
    blocks.0): the backward prefetches are the guide's rows, and the step is the model's."""
    out: dict[str, Any] = {}
    for case, targets in BACKWARD_CASES.items():
        modelled = prefetches(step_sequence(BLOCKS, ROOT, backward_targets=targets), phase="backward")
        _require_row(expected, case, modelled, reason="order-differs-from-guide", what=f"model, {case}")
        (step,) = one_step(ctx, "gpt", True, backward_targets=targets)
        fetched = prefetches(step["sequence"], phase="backward")
        _require_row(expected, case, fetched, reason="prefetches-differ", what=f"backward {case}", case=case)
        matches_model(step)
        out[case] = {"targets": targets, "backward_prefetches": fetched}
    return out


def order_of_this_step(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """A model whose second step runs its blocks in reverse. Implicit: step 2's backward prefetches follow step 2's
    post-forward order (nothing is kept from step 1). Explicit lookahead 1, set for the module order: step 2
    follows the targets as given, now wrong for that order. Both steps are the model's; step 2's prefetches are the
    guide's rows."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from checks.workloads.reorderable import ReorderableGPT

    out: dict[str, Any] = {}
    for case, targets in (("implicit", None), ("explicit", lookahead(BLOCKS, ROOT, 1, "backward"))):
        model = ReorderableGPT(preset("tiny"), seed=0).to(ctx.device)
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        if targets:
            set_targets(model, "gpt", "backward", targets)
        steps = []
        for step, order in ((1, [0, 1, 2]), (2, [2, 1, 0])):
            model.blocks.order = order
            forward = tuple(f"blocks.{i}" for i in order)
            label = f"{case}, step {step}, blocks {order}"
            steps.append(run_step(ctx, model, "gpt", forward, None, backward_targets=targets, step=step, label=label))
        fetched = prefetches(steps[1]["sequence"], phase="backward")
        _require_row(expected, case, fetched, reason="prefetches-differ", what=f"{case}: step 2's backward "
                     "prefetches", case=case)  # fmt: skip
        for step in steps:
            step["where"]["case"] = case
            matches_model(step)
        second = steps[1]["sequence"]
        backward = second[second.index(f"pre_backward {ROOT}") :]
        out[case] = {
            "step 1": prefetches(steps[0]["sequence"], phase="backward"),
            "step 2": fetched,
            "own_unshards_step_2": [e.removeprefix("unshard ") for e in backward if e.startswith("unshard ")],
            "backward_all_gathers_step_2": steps[1]["all_gathers"]["backward"],
        }
    return out
