"""Checks for guide 17, prefetch in FSDP2: which group each ``fully_shard`` hook all-gathers, for itself or ahead.

Expected sequences come from the torch-free rule model (`checks.models.fsdp2_prefetch`: `step_sequence`, fed the
units' structural forward order and the targets the check sets) and from the guide's expect blocks; the
all-gather counts from the guide's derivation (`all_gathers_by_formula`). Nothing expected is recorded from torch.
Torch's own post-forward order (``FSDPCommContext.post_forward_order``) is compared with the structural order
first, so the model's input is what torch used.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import torch
from torch import nn

from checks.models.fsdp2_prefetch import all_gathers, all_gathers_by_formula, lookahead, prefetches, step_sequence
from checks.naming import ROOT, unit_name
from checks.probes import assert_sequence, record_comm, record_events
from checks.probes.calls import is_plumbing
from checks.probes.memory_series import record_forward_memory
from checks.ranks.context import RankContext
from checks.violation import Violation, require, require_equal
from checks.workloads import toy
from checks.workloads.gpt import batch, fsdp2_gpt
from mini_gpt import preset

BLOCKS = ("blocks.0", "blocks.1", "blocks.2")
# Forward order of the inner units implied by each workload's structure; the root runs first and ends last.
FORWARD = {"gpt": BLOCKS, "toy": toy.DEFAULT_UNITS}
# Inner units whose forward inputs need no gradient: the toy's "0" takes the model's input, so autograd never runs
# its post-backward and the final callback does (after the root's).
NO_INPUT_GRAD = {"gpt": (), "toy": ("0",)}
RESHARD: dict[str, bool | None] = {"True": True, "None": None, "False": False}
_GROUP = "torch.distributed.fsdp._fully_shard._fsdp_param_group:FSDPParamGroup"
_STATE = "torch.distributed.fsdp._fully_shard._fsdp_state:FSDPState"


def _build(ctx: RankContext, workload: str, reshard: bool | None) -> nn.Module:
    if workload == "gpt":
        return fsdp2_gpt(ctx, reshard)
    model = toy.toy_model(ctx.device)
    if reshard is None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        for name in toy.DEFAULT_UNITS:
            fully_shard(getattr(model, name), mesh=mesh)
        return fully_shard(model, mesh=mesh)
    return toy.wrap_fsdp2(model, ctx, reshard_after_forward=reshard)


def _loss(ctx: RankContext, workload: str, model: nn.Module, step: int = 0) -> torch.Tensor:
    if workload == "gpt":
        return model(*batch(ctx, step=step))[1]
    return model(toy.toy_batch(ctx, step=step)).sum()


def _modules(model: nn.Module, workload: str) -> dict[str, nn.Module]:
    return {ROOT: model, **{name: model.get_submodule(name) for name in FORWARD[workload]}}


def _set_targets(model: nn.Module, workload: str, direction: str, targets: dict[str, list[str]]) -> None:
    modules = _modules(model, workload)
    for unit, wanted in targets.items():
        setter = getattr(modules[unit], f"set_modules_to_{direction}_prefetch")
        setter([modules[t] for t in wanted])


def torch_post_forward_order(model: nn.Module) -> list[str]:
    """The root state's ``post_forward_order`` now, as unit names."""
    order = model._get_fsdp_state()._comm_ctx.post_forward_order
    return [unit_name(group._module_fqn) for group in order]


def _events(events: Any) -> list[str]:
    return [e.describe() for e in events]


def one_step(
    ctx: RankContext, workload: str, reshard: bool | None, *, forward_targets: dict[str, list[str]] | None = None,
    backward_targets: dict[str, list[str]] | None = None, steps: int = 1,
) -> list[dict[str, Any]]:  # fmt: skip
    """Forward and backward, ``steps`` times on one model; per step what `run_step` returns."""
    model = _build(ctx, workload, reshard)
    if forward_targets:
        _set_targets(model, workload, "forward", forward_targets)
    if backward_targets:
        _set_targets(model, workload, "backward", backward_targets)
    return [
        run_step(ctx, model, workload, FORWARD[workload], reshard, forward_targets=forward_targets,
                 backward_targets=backward_targets, step=step)
        for step in range(1, steps + 1)
    ]  # fmt: skip


def run_step(
    ctx: RankContext, model: nn.Module, workload: str, forward: tuple[str, ...], reshard: bool | None, *,
    forward_targets: dict[str, list[str]] | None = None, backward_targets: dict[str, list[str]] | None = None,
    step: int = 1, label: str = "",
) -> dict[str, Any]:  # fmt: skip
    """One forward and backward of ``model``, whose inner units run in ``forward`` order: the events, torch's
    post-forward order (checked against ``forward``), the all-gathers issued in forward and in backward, and what
    `step_sequence` expects (`matches_model` compares them)."""
    expected = step_sequence(
        forward, ROOT, reshard_after_forward=reshard, forward_targets=forward_targets,
        backward_targets=backward_targets, no_input_grad=NO_INPUT_GRAD[workload],
    )  # fmt: skip
    where = {"workload": workload, "reshard_after_forward": str(reshard), "step": step}
    units = {unit: module for unit, module in _modules(model, workload).items() if unit != ROOT}
    with (
        record_events(model, label=label or f"step {step}, forward {', '.join(forward)}") as events,
        record_forward_memory(model, units) as memory,
    ):
        with record_comm() as forward_comm:
            loss = _loss(ctx, workload, model)
        memory.mark("after forward")
        order = torch_post_forward_order(model)
        with record_comm() as backward_comm:
            loss.backward()
        memory.mark("after backward")
    what = f"{workload}, reshard_after_forward={reshard}, step {step}: torch's post-forward order"
    require_equal(order, [*forward, ROOT], reason="post-forward-order", what=what, **where)
    gathers = {
        "forward": sum(c.op == "all_gather" for c in forward_comm),
        "backward": sum(c.op == "all_gather" for c in backward_comm),
    }
    return {"sequence": _events(events), "post_forward": order, "all_gathers": gathers, "expected": expected,
            "where": where, "memory": memory.series.points}  # fmt: skip


def matches_model(step: dict[str, Any]) -> None:
    """The step's whole event sequence is `step_sequence`'s, and the collective recorder's all-gathers, in forward
    and in backward, are that sequence's count."""
    try:
        assert_sequence(step["sequence"], step["expected"], what=f"step {step['where']}", reason="sequence-differs")
    except Violation as failure:
        failure.details.update(step["where"])
        raise
    what = f"step {step['where']}: all-gathers recorded, against the model's"
    require_equal(step["all_gathers"], all_gathers(step["expected"]), reason="all-gathers", what=what, **step["where"])


def _pairs(lines: list[str]) -> list[str]:
    return ["".join(line.split()) for line in lines]


def no_implicit_forward_prefetch(ctx: RankContext, stated: list[str]) -> dict[str, Any]:
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
        require_equal(issued, stated, reason="forward-differs", what=f"step {number}: groups unsharded by their own "
                      "pre-forward, against the guide", step=number)  # fmt: skip
        matches_model(step)
        out[str(number)] = {"forward_prefetches": len(fetched), "own_unshards": issued}
    out["forward_prefetches"] = sum(out[k]["forward_prefetches"] for k in ("1", "2"))
    return out


def implicit_backward_prefetch(ctx: RankContext, stated: list[str]) -> dict[str, Any]:
    """With no explicit targets each group's pre-backward prefetches the entry before its own in the post-forward
    order: mini_gpt and the toy, with ``reshard_after_forward`` True and the default (the root kept unsharded);
    mini_gpt's backward prefetches are the guide's, and the whole step is the rule model's."""
    want = {"gpt": _pairs(stated), "toy": prefetches(step_sequence(FORWARD["toy"], ROOT), phase="backward")}
    model_pairs = prefetches(step_sequence(BLOCKS, ROOT), phase="backward")
    require_equal(want["gpt"], model_pairs, reason="order-differs-from-guide", what="the model's prefetches")
    out: dict[str, Any] = {}
    for workload in ("gpt", "toy"):
        for label in ("True", "None"):
            (step,) = one_step(ctx, workload, RESHARD[label])
            fetched = prefetches(step["sequence"], phase="backward")
            require_equal(fetched, want[workload], reason="prefetches-differ", what=f"{workload} {label}: backward "
                          "prefetches", workload=workload, reshard=label)  # fmt: skip
            matches_model(step)
            out[f"{workload} {label}"] = {"prefetches": fetched, "post_forward": step["post_forward"]}
    return out


def explicit_forward_prefetch(ctx: RankContext, stated: list[str]) -> dict[str, Any]:
    """``set_modules_to_forward_prefetch`` with a lookahead of 1 and of 2 (each block names the next k blocks):
    the forward prefetches are the guide's table, and the step is the model's."""
    want = {line.split()[0]: line.split()[1:] for line in stated}
    out: dict[str, Any] = {}
    series: dict[str, Any] = {}
    for k in (1, 2):
        targets = lookahead(BLOCKS, ROOT, k, "forward")
        modelled = prefetches(step_sequence(BLOCKS, ROOT, forward_targets=targets), phase="forward")
        what = f"model, lookahead {k}"
        require_equal(modelled, want[f"lookahead-{k}"], reason="order-differs-from-guide", what=what)
        (step,) = one_step(ctx, "gpt", True, forward_targets=targets)
        fetched = prefetches(step["sequence"], phase="forward")
        require_equal(fetched, want[f"lookahead-{k}"], reason="prefetches-differ", what=f"forward lookahead {k}",
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


def explicit_backward_prefetch(ctx: RankContext, stated: list[str]) -> dict[str, Any]:
    """``set_modules_to_backward_prefetch`` with a lookahead of 1 and of 2 (the root and each block name the k
    units before them in post-forward order), and one target that is not the implicit one (the root names
    blocks.0): the backward prefetches are the guide's table, and the step is the model's."""
    want = {line.split()[0]: line.split()[1:] for line in stated}
    out: dict[str, Any] = {}
    for case, targets in BACKWARD_CASES.items():
        require_equal(prefetches(step_sequence(BLOCKS, ROOT, backward_targets=targets), phase="backward"),
                      want[case], reason="order-differs-from-guide", what=f"model, {case}")  # fmt: skip
        (step,) = one_step(ctx, "gpt", True, backward_targets=targets)
        fetched = prefetches(step["sequence"], phase="backward")
        require_equal(fetched, want[case], reason="prefetches-differ", what=f"backward {case}", case=case)
        matches_model(step)
        out[case] = {"targets": targets, "backward_prefetches": fetched}
    return out


def all_gathers_per_step(ctx: RankContext, stated: list[str]) -> dict[str, Any]:
    """All-gathers issued by one step's forward and backward, by ``reshard_after_forward``, with no explicit
    targets and with a lookahead of 2 both ways: the guide's derivation, the same with and without prefetch."""
    want = {line.split()[0]: [int(w) for w in line.split()[1:]] for line in stated}
    out: dict[str, Any] = {}
    for label, reshard in RESHARD.items():
        formula = all_gathers_by_formula(len(BLOCKS), reshard)
        derived = [formula["forward"], formula["backward"], sum(formula.values())]
        what = f"reshard_after_forward={label}: the formula"
        require_equal(derived, want[label], reason="formula-differs-from-guide", what=what)
        for config in ("implicit", "lookahead-2"):
            targets = {}
            if config != "implicit":
                targets = {"forward_targets": lookahead(BLOCKS, ROOT, 2, "forward"),
                           "backward_targets": lookahead(BLOCKS, ROOT, 2, "backward")}  # fmt: skip
            (step,) = one_step(ctx, "gpt", reshard, **targets)
            what = f"reshard_after_forward={label}, {config}: all-gathers"
            require_equal(step["all_gathers"], formula, reason="all-gathers", what=what, reshard=label, config=config)
            out[f"{label} {config}"] = {**step["all_gathers"], "total": sum(step["all_gathers"].values())}
    return out


def _setting(text: str) -> bool | int | None:
    return {"True": True, "False": False, "None": None}[text] if text in ("True", "False", "None") else int(text)


AFTER_FORWARD = {"free": "freed", "reshard": "resharded to a smaller mesh"}


def per_unit_settings(ctx: RankContext, settings: dict[str, str], stated: list[str]) -> dict[str, Any]:
    """mini_gpt tiny with each unit's own ``reshard_after_forward`` (``settings``: unit → "True", "False",
    "None" or an int), passed to its own ``fully_shard`` call: the step's whole event sequence and its
    all-gathers are `step_sequence`'s for that mapping; what each unit does after forward and which backward
    prefetches issue an all-gather are the guide's lines."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from mini_gpt import GPT

    parsed = {unit: _setting(text) for unit, text in settings.items()}
    model = GPT(preset("tiny"), seed=0).to(ctx.device)
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for unit in (*BLOCKS, ROOT):
        module = model if unit == ROOT else model.get_submodule(unit)
        kwargs = {} if parsed[unit] is None else {"reshard_after_forward": parsed[unit]}
        fully_shard(module, mesh=mesh, **kwargs)
    expected = step_sequence(BLOCKS, ROOT, reshard_after_forward=parsed, world_size=ctx.world_size)
    with record_events(model, label="per-unit settings") as events:
        with record_comm() as forward_comm:
            loss = model(*batch(ctx))[1]
        with record_comm() as backward_comm:
            loss.backward()
    gathers = {
        "forward": sum(c.op == "all_gather" for c in forward_comm),
        "backward": sum(c.op == "all_gather" for c in backward_comm),
    }
    where = {"settings": " ".join(f"{u}={t}" for u, t in settings.items())}
    step = {"sequence": _events(events), "expected": expected, "all_gathers": gathers, "where": where}
    matches_model(step)
    split = next(i for i, e in enumerate(step["sequence"]) if e.startswith("pre_backward "))
    forward_events = step["sequence"][:split]
    lines = []
    for unit in (ROOT, *BLOCKS):
        done = [AFTER_FORWARD[kind] for kind in AFTER_FORWARD if f"{kind} {unit}" in forward_events]
        lines.append(f"{unit}: {done[0] if done else 'kept'} after forward")
    lines.append(f"backward prefetches: {' '.join(prefetches(step['sequence'], phase='backward'))}")
    require_equal(lines, stated, reason="settings-differ-from-guide", what="each unit after forward, and backward")
    return {"lines": lines, "all_gathers": gathers, "sequence": step["sequence"]}


def root_without_parameters(ctx: RankContext, stated: list[str]) -> dict[str, Any]:
    """The toy with its last layer made a unit too, so the root holds no parameter of its own: the step's whole
    event sequence and all-gathers are `step_sequence`'s with ``root_params=False``; torch's post-forward order,
    the backward's prefetches and the root's own events are the guide's lines."""
    model = toy.wrap_fsdp2(toy.toy_model(ctx.device), ctx, units=("0", "1", "2"))
    require(model._get_fsdp_state()._fsdp_param_group is None, "root-has-a-group",
            "the root holds parameters of its own: the case is not built")  # fmt: skip
    forward = ("0", "1", "2")
    expected = step_sequence(forward, ROOT, no_input_grad=NO_INPUT_GRAD["toy"], root_params=False)
    with record_events(model, label="a root without parameters") as events:
        with record_comm() as forward_comm:
            loss = _loss(ctx, "toy", model)
        order = torch_post_forward_order(model)
        with record_comm() as backward_comm:
            loss.backward()
    gathers = {
        "forward": sum(c.op == "all_gather" for c in forward_comm),
        "backward": sum(c.op == "all_gather" for c in backward_comm),
    }
    step = {"sequence": _events(events), "expected": expected, "all_gathers": gathers, "where": {"root": "no params"}}
    matches_model(step)
    root_events = [e.split()[0] for e in step["sequence"] if e.split()[-1] == ROOT]
    callback = [e.split()[-1] for e in step["sequence"] if e.startswith("final_callback ")]
    lines = [
        f"post-forward order: {' '.join(order)}",
        f"backward prefetches: {' '.join(prefetches(step['sequence'], phase='backward'))}",
        f"root events: {' '.join(root_events)}",
        f"final callback queued by: {' '.join(callback)}",
    ]
    require_equal(lines, stated, reason="root-differs-from-guide", what="a root without parameters")
    return {"lines": lines, "all_gathers": gathers}


# Several forwards before backward: each case is (workload, reshard_after_forward, the forwards each backward
# covers in call order, each backward's is_last_backward); every case runs two forwards.
SEVERAL_FORWARDS: dict[str, tuple[str, bool | None, list[list[int]], list[bool]]] = {
    "one backward": ("gpt", None, [[1, 2]], [True]),
    "two backwards": ("gpt", None, [[2], [1]], [True, True]),
    "two, the first not last": ("gpt", None, [[2], [1]], [False, True]),
    "False, one backward": ("gpt", False, [[1, 2]], [True]),
    "toy, one backward": ("toy", None, [[1, 2]], [True]),
}


SEVERAL_FORWARDS_COLUMNS = ("forward", "backward", "prefetched", "post_backwards", "reduce_scatters")


def several_forwards_row(sequence: list[str], gathers: dict[str, int], reduce_scatters: int) -> list[int]:
    """One line of ``expect several-forwards``: all-gathers in forward and in backward, the backward's prefetches,
    post-backward hooks run, reduce-scatters."""
    post_backwards = sum(e.startswith("post_backward ") for e in sequence)
    prefetched = len(prefetches(sequence, phase="backward"))
    return [gathers["forward"], gathers["backward"], prefetched, post_backwards, reduce_scatters]


def _stated_rows(stated: list[str]) -> dict[str, list[int]]:
    """``label  n n n n n`` lines: the label is everything before the last five numbers."""
    rows = {}
    for line in stated:
        words = line.split()
        rows[" ".join(words[:-5])] = [int(w) for w in words[-5:]]
    return rows


def several_forwards(ctx: RankContext, stated: list[str]) -> dict[str, Any]:
    """Two forwards before backward, for each case of `SEVERAL_FORWARDS`: torch's post-forward order holds one
    entry per use; the whole event sequence is `step_sequence`'s with ``forwards=2`` and the case's backwards, and
    the recorder's all-gathers (forward, backward) and reduce-scatters are that sequence's counts. Each case's
    line is the guide's, from the model first and then from the run."""
    want = _stated_rows(stated)
    require_equal(sorted(want), sorted(SEVERAL_FORWARDS), reason="cases-differ-from-guide", what="the cases")
    out: dict[str, Any] = {}
    for case, (workload, reshard, backwards, last) in SEVERAL_FORWARDS.items():
        where = {"case": case}
        forward = FORWARD[workload]
        expected = step_sequence(
            forward, ROOT, reshard_after_forward=reshard, no_input_grad=NO_INPUT_GRAD[workload], forwards=2,
            backwards=backwards, last_backward=last,
        )  # fmt: skip
        modelled = several_forwards_row(
            expected, all_gathers(expected), sum(e.startswith("reduce_grad ") for e in expected)
        )
        require_equal(modelled, want[case], reason="model-differs-from-guide", what=f"{case}: the model", **where)
        model = _build(ctx, workload, reshard)
        with record_events(model, label=f"two forwards, {case}") as events:
            with record_comm() as forward_comm:
                losses = [_loss(ctx, workload, model, step) for step in (1, 2)]
            order = torch_post_forward_order(model)
            with record_comm() as backward_comm:
                for covered, is_last in zip(backwards, last, strict=True):
                    model.set_is_last_backward(is_last)
                    sum(losses[number - 1] for number in covered).backward()
        require_equal(order, [*forward, ROOT] * 2, reason="post-forward-order", what=f"{case}: torch's post-forward "
                      "order, one entry per use", **where)  # fmt: skip
        gathers = {
            "forward": sum(c.op == "all_gather" for c in forward_comm),
            "backward": sum(c.op == "all_gather" for c in backward_comm),
        }
        step = {"sequence": _events(events), "expected": expected, "all_gathers": gathers, "where": where}
        matches_model(step)
        reduce_scatters = sum(c.op == "reduce_scatter" for c in backward_comm)
        require_equal(reduce_scatters, modelled[-1], reason="reduce-scatters", what=f"{case}: reduce-scatters "
                      "recorded, against the model's", **where)  # fmt: skip
        row = several_forwards_row(step["sequence"], gathers, reduce_scatters)
        require_equal(row, want[case], reason="several-differs-from-guide", what=f"{case}: the run", **where)
        out[case] = dict(zip(SEVERAL_FORWARDS_COLUMNS, row, strict=True))
    return out


def order_of_this_step(ctx: RankContext, stated: list[str]) -> dict[str, Any]:
    """A model whose second step runs its blocks in reverse. Implicit: step 2's backward prefetches follow step 2's
    post-forward order (nothing is kept from step 1). Explicit lookahead 1, set for the module order: step 2
    follows the targets as given, now wrong for that order. Both steps are the model's; step 2's prefetches are the
    guide's table."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from checks.workloads.reorderable import ReorderableGPT

    want = {line.split()[0]: line.split()[1:] for line in stated}
    out: dict[str, Any] = {}
    for case, targets in (("implicit", None), ("explicit", lookahead(BLOCKS, ROOT, 1, "backward"))):
        model = ReorderableGPT(preset("tiny"), seed=0).to(ctx.device)
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        if targets:
            _set_targets(model, "gpt", "backward", targets)
        steps = []
        for step, order in ((1, [0, 1, 2]), (2, [2, 1, 0])):
            model.blocks.order = order
            forward = tuple(f"blocks.{i}" for i in order)
            label = f"{case}, step {step}, blocks {order}"
            steps.append(run_step(ctx, model, "gpt", forward, None, backward_targets=targets, step=step, label=label))
        fetched = prefetches(steps[1]["sequence"], phase="backward")
        require_equal(fetched, want[case], reason="prefetches-differ", what=f"{case}: step 2's backward prefetches",
                      case=case)  # fmt: skip
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


# -- where and when the post-forward order is cleared ---------------------------------------------------------

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


def _paths(stated: list[str]) -> dict[str, list[str]]:
    """The call path of each label, outermost first: a ``label  A`` row starts it, and each ``→ B`` row after it
    adds the function the row above calls (one row per call, so a path of long names fits 78 columns)."""
    paths: dict[str, list[str]] = {}
    current: list[str] = []
    for line in stated:
        head, rest = line.split(None, 1)
        if head == "→":
            current.append(rest.strip())
        else:
            current = paths[head] = [rest.strip()]
    return paths


def _require_clears(
    order: WatchedOrder, since: int, expected: list[tuple[list[str], int]], *, what: str, **where: Any
) -> None:  # fmt: skip
    """The clears noted after the first ``since`` are ``expected``: (call path, entries held) each."""
    seen = [(clear["path"], clear["entries"]) for clear in order.clears[since:]]
    require_equal(seen, expected, reason="clear-path-differs", what=f"{what}: clears of the order (path, entries)",
                  **where)  # fmt: skip


def order_cleared_at_step_end(ctx: RankContext, paths: list[str], lengths: list[str]) -> dict[str, Any]:
    """mini_gpt under the default settings: the post-forward order is cleared once per step, at the end of the
    backward that is the last one (``is_last_backward``), through the guide's call path; a backward with
    ``set_is_last_backward(False)`` keeps it, so the next forward appends to it. The list's length after each
    forward and backward is the guide's table, which is n + 1 entries per forward since the last clear."""
    path = _paths(paths)["automatic"]
    want = [(" ".join(line.split()[:-1]), int(line.split()[-1])) for line in lengths]
    per_forward, held, derived = len(BLOCKS) + 1, 0, []
    for label, _ in want:
        held = held + per_forward if label.startswith("forward") else held if "not last" in label else 0
        derived.append((label, held))
    require_equal(want, derived, reason="lengths-differ-from-formula", what="the guide's table, against n + 1 "
                  "entries per forward since the last clear")  # fmt: skip
    model = fsdp2_gpt(ctx, None)
    observed: list[tuple[str, int]] = []
    order: WatchedOrder | None = None
    expected_clears: list[tuple[list[str], int]] = []
    for label, _ in want:
        if label.startswith("forward"):
            loss = _loss(ctx, "gpt", model)
            order = order if order is not None else watch_order(model)
            observed.append((label, len(order)))
            continue
        assert order is not None
        last = "not last" not in label
        model.set_is_last_backward(last)
        before, held_before = len(order.clears), len(order)
        loss.backward()
        observed.append((label, len(order)))
        _require_clears(order, before, [(path, held_before)] if last else [], what=label, step=label)
        if last:
            expected_clears.append((path, held_before))
    require_equal(observed, want, reason="order-length-differs", what="the post-forward order's length")
    return {
        "lengths": {label: n for label, n in observed},
        "clears": [{"path": " → ".join(clear["path"]), "entries": clear["entries"]} for clear in order.clears],
    }


def manual_finalization_keeps_order(
    ctx: RankContext, paths: list[str], prefetched: list[str], lengths: list[str]
) -> dict[str, Any]:  # fmt: skip
    """torch 2.15's ``set_manual_backward_finalization(True)``: backward returns with the post-forward order intact
    and the root's reduce-scatter not issued (its post-backward is left pending by the final callback), with the
    implicit backward prefetches unchanged; ``finalize_backward()`` issues it and clears the order through the
    guide's path. With ``async_op=True`` the order is kept until the handle's ``wait()``, which clears it, and a
    forward before that raises."""
    want_paths = _paths(paths)
    want = {" ".join(line.split()[:-1]): int(line.split()[-1]) for line in lengths}
    model = fsdp2_gpt(ctx, None)
    model.set_manual_backward_finalization(True)
    observed: dict[str, int] = {}
    with record_events(model, label="manual finalization, step 1") as events:
        loss = _loss(ctx, "gpt", model)
        order = watch_order(model)
        with record_comm() as backward_comm:
            loss.backward()
    observed["backward, manual"] = len(order)
    _require_clears(order, 0, [], what="backward, manual", step=1)
    fetched = prefetches(_events(events), phase="backward")
    require_equal(fetched, _pairs(prefetched), reason="prefetches-differ", what="manual finalization: backward "
                  "prefetches, against the guide's implicit ones", step=1)  # fmt: skip
    scatters = {"backward": sum(c.op == "reduce_scatter" for c in backward_comm)}
    with record_comm() as finalize_comm:
        model.finalize_backward()
    scatters["finalize_backward"] = sum(c.op == "reduce_scatter" for c in finalize_comm)
    observed["finalize_backward"] = len(order)
    want_scatters = {"backward": len(BLOCKS), "finalize_backward": 1}  # the blocks' from autograd; the root's deferred
    require_equal(scatters, want_scatters, reason="reduce-scatters-differ", what="reduce-scatters: one per block in "
                  "backward, the root's in finalize_backward", step=1)  # fmt: skip
    _require_clears(order, 0, [(want_paths["manual"], want["backward, manual"])], what="finalize_backward", step=1)

    loss = _loss(ctx, "gpt", model)
    loss.backward()
    handle = model.finalize_backward(async_op=True)
    observed["finalize_backward, async"] = len(order)
    _require_clears(order, 1, [], what="finalize_backward(async_op=True)", step=2)
    try:
        _loss(ctx, "gpt", model)
    except RuntimeError as error:
        raised = str(error)
    else:
        raise Violation("forward-before-wait-ran", "a forward before the handle's wait() ran; torch 2.15's "
                        "_pre_forward raises there", step=2)  # fmt: skip
    require("must be waited on before forward" in raised, "forward-raised-otherwise", f"the forward before wait() "
            f"raised {raised!r}", step=2)  # fmt: skip
    handle.wait()
    observed["wait"] = len(order)
    _require_clears(order, 1, [(want_paths["async"], want["backward, manual"])], what="handle.wait()", step=2)
    require_equal(observed, want, reason="order-length-differs", what="the post-forward order's length")
    loss = _loss(ctx, "gpt", model)  # the next step starts on an empty order
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


# -- break-it recipes: this guide's behaviour bent on purpose (tests/break_it/ applies them) --------------


def prefetch_two_back(original: Any, self: Any) -> None:
    """``_backward_prefetch`` that prefetches the entry two before the group's own, not one. (The group is called
    ``self`` so that the event recorder names the issuer.)"""
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

    if self._training_state != TrainingState.PRE_BACKWARD or not self._post_forward_indices:
        return
    index = self._post_forward_indices.pop()
    if index > 1:
        self._prefetch_unshard(self.comm_ctx.post_forward_order[index - 2], "backward")


def forward_prefetch_like_fsdp1(original: Any, self: Any, module: Any, args: Any, kwargs: Any) -> Any:
    """``FSDPState._pre_forward`` that, after its own unshard, prefetches the next state's groups in module
    pre-order: an implicit forward prefetch, as FSDP1's ``forward_prefetch=True`` would issue (``self``: the
    state, so that the event recorder names the issuer)."""
    state = self
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    first = state._training_state not in (TrainingState.FORWARD, TrainingState.PRE_BACKWARD)
    result = original(state, module, args, kwargs)
    states = state._state_ctx.all_states
    if first and state in states and states.index(state) + 1 < len(states):
        for group in states[states.index(state) + 1]._fsdp_param_groups:
            FSDPParamGroup._prefetch_unshard(group, "forward")
    return result


def ignore_backward_targets(original: Any, state: Any, grad: Any) -> Any:
    """``FSDPState._pre_backward`` that ignores the explicit targets: every group takes the implicit path."""
    kept = state._states_to_backward_prefetch
    state._states_to_backward_prefetch = []
    try:
        return original(state, grad)
    finally:
        state._states_to_backward_prefetch = kept


def ignore_forward_targets(original: Any, state: Any, module: Any, args: Any, kwargs: Any) -> Any:
    """``FSDPState._pre_forward`` that ignores the explicit targets."""
    kept = state._states_to_forward_prefetch
    state._states_to_forward_prefetch = []
    try:
        return original(state, module, args, kwargs)
    finally:
        state._states_to_forward_prefetch = kept


def first_target_only(original: Any, module: Any, modules: list[Any]) -> None:
    """``set_modules_to_{forward,backward}_prefetch`` that keeps only the first module asked for (lookahead 1)."""
    return original(module, modules[:1])


def keep_unsharded_after_forward(original: Any, group: Any) -> None:
    """``FSDPParamGroup.reshard`` that does nothing in forward: every setting behaves as False."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

    if group._training_state == TrainingState.FORWARD:
        return None
    return original(group)


def regather_when_pending(original: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """``FSDPParamGroup.unshard`` that drops a pending all-gather and issues a new one, instead of absorbing the
    second request: every prefetched group is all-gathered twice."""
    self._all_gather_result = None
    return original(self, *args, **kwargs)


def implicit_prefetch_always(original: Any, self: Any, default_prefetch: bool, *unused: Any) -> None:
    """``FSDPParamGroup.pre_backward`` told to take the implicit path even when the unit has explicit targets."""
    return original(self, True, *unused)


def keep_order_across_steps(original: Any, self: Any) -> None:
    """``_root_post_backward_final_callback`` whose step end does not clear the post-forward order: the next
    forward appends to the old one."""
    kept = list(self._comm_ctx.post_forward_order)
    original(self)
    self._comm_ctx.post_forward_order[:0] = kept


def last_backward_always(original: Any, self: Any) -> None:
    """``_root_post_backward_final_callback`` that ignores ``set_is_last_backward(False)``: every backward ends the
    iteration, so a gradient-accumulation backward clears the post-forward order too."""
    kept = self._state_ctx.is_last_backward
    self._state_ctx.is_last_backward = True
    try:
        return original(self)
    finally:
        self._state_ctx.is_last_backward = kept


def callback_ignores_manual_mode(original: Any, self: Any) -> None:
    """``_root_post_backward_final_callback`` run as if manual finalization were off (torch >= 2.15): it ends the
    iteration itself, clearing the order and reducing the root's gradient before ``finalize_backward``."""
    kept = self._state_ctx.manual_backward_finalization_active
    self._state_ctx.manual_backward_finalization_active = False
    try:
        return original(self)
    finally:
        self._state_ctx.manual_backward_finalization_active = kept


def deferred_reductions_dropped(original: Any, self: Any) -> None:
    """``_root_post_backward_final_callback`` that forgets the post-backwards it deferred (torch >= 2.15, manual
    finalization): ``finalize_backward`` then never reduce-scatters the root's gradient."""
    original(self)
    for state in self._state_ctx.all_states:
        for group in state._fsdp_param_groups:
            group._post_backward_pending = False


def finalize_always_waits(original: Any, self: Any, *, wait_for_gradient_reduction: bool = True) -> None:
    """``FSDPState.finalize_backward`` that waits even when asked not to (torch >= 2.15): an asynchronous
    ``finalize_backward`` ends the iteration, and clears the order, before its handle is waited on."""
    return original(self, wait_for_gradient_reduction=True)


def forward_while_reduction_pending(original: Any, self: Any, module: Any, args: Any, kwargs: Any) -> Any:
    """``FSDPState._pre_forward`` without torch 2.15's guard: a forward runs while an asynchronous gradient
    reduction is still pending."""
    pending, active = self._state_ctx.gradient_reduction_pending, self._comm_ctx.active_gradient_reduction
    self._state_ctx.gradient_reduction_pending, self._comm_ctx.active_gradient_reduction = False, None
    try:
        return original(self, module, args, kwargs)
    finally:
        self._state_ctx.gradient_reduction_pending, self._comm_ctx.active_gradient_reduction = pending, active


def clear_before_finalize(original: Any, self: Any) -> None:
    """``_root_post_backward_final_callback`` that empties the post-forward order first, on a last backward, before
    any group's ``finalize_backward`` has run: the list is cleared from the wrong place and too early."""
    if self._state_ctx.is_last_backward and not getattr(self._state_ctx, "manual_backward_finalization_active", False):
        self._comm_ctx.post_forward_order.clear()
    return original(self)


def post_forward_mesh_ignored(original: Any, self: Any) -> None:
    """``FSDPParamGroup._to_sharded_post_forward`` resharding to the whole mesh instead: an int setting read as
    True."""
    self._to_sharded()


def callback_queued_every_time(original: Any, self: Any) -> None:
    """``_register_root_post_backward_final_callback`` that never finds the callback queued: every state's
    pre-backward queues its own, and the final callback runs once per state."""
    self._state_ctx.post_backward_final_callback_queued = False
    original(self)


def record_first_use_only(original: Any, self: Any) -> None:
    """``_record_post_forward`` without multiplicity: a group already in the post-forward order is not appended
    again, so a second forward adds no entries."""
    if self._post_forward_indices:
        return None
    return original(self)


def keep_unsharded_without_gradient(original: Any, self: Any, *unused: Any) -> None:
    """``FSDPParamGroup.post_backward`` that keeps the group unsharded when no parameter has a gradient yet (an
    earlier use of a group used twice), so the later use finds it unsharded and all-gathers nothing."""
    has_grad = any(
        hasattr(param, "_unsharded_param") and param.unsharded_param.grad is not None for param in self.fsdp_params
    )
    if has_grad:
        return original(self, *unused)
    kept, self.reshard_after_backward = self.reshard_after_backward, False
    try:
        return original(self, *unused)
    finally:
        self.reshard_after_backward = kept


def post_backward_once(original: Any, self: Any, *unused: Any) -> None:
    """``FSDPParamGroup.post_backward`` read as idempotent: a group's later calls, on the same model, return at
    once, so the use that holds the accumulated gradient never frees or reduce-scatters it."""
    done = self.comm_ctx.__dict__.setdefault("_break_it_post_backward_ran", set())
    if id(self) in done:
        return None
    done.add(id(self))
    return original(self, *unused)
