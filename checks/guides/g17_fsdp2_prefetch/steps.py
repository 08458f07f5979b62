"""Guide 17's workloads run one step at a time: mini_gpt or the toy wrapped with ``fully_shard`` per unit, a
forward and backward under the event and collective recorders, and the step compared with the rule model's
(`checks.models.fsdp2_prefetch.step_sequence`). Every claim module of the guide runs its steps through here, and
names a prefetch as the recorder does (`arrow`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from checks.expected import Row
from checks.models.fsdp2_prefetch import all_gathers, step_sequence
from checks.naming import ROOT, unit_name
from checks.probes.comm import record_comm
from checks.probes.events import record_events
from checks.probes.expect import assert_sequence
from checks.probes.memory_series import record_forward_memory
from checks.ranks.context import RankContext
from checks.violation import Violation, require_equal
from checks.workloads import toy
from checks.workloads.gpt import batch, fsdp2_gpt

BLOCKS = ("blocks.0", "blocks.1", "blocks.2")
# Forward order of the inner units implied by each workload's structure; the root runs first and ends last.
FORWARD = {"gpt": BLOCKS, "toy": toy.DEFAULT_UNITS}
# Inner units whose forward inputs need no gradient: the toy's "0" takes the model's input, so autograd never runs
# its post-backward and the final callback does (after the root's).
NO_INPUT_GRAD = {"gpt": (), "toy": ("0",)}
RESHARD: dict[str, bool | None] = {"True": True, "None": None, "False": False}


def arrow(row: Row) -> str:
    """A ``pairs`` row as the event recorder names a prefetch: ``issuer→target``."""
    return f"{row.key}→{row.value}"


def build(ctx: RankContext, workload: str, reshard: bool | None) -> nn.Module:
    """mini_gpt or the toy, each unit and then the root wrapped with ``fully_shard``; ``reshard`` None leaves
    ``reshard_after_forward`` at its default."""
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


def loss_of(ctx: RankContext, workload: str, model: nn.Module, step: int = 0) -> torch.Tensor:
    if workload == "gpt":
        return model(*batch(ctx, step=step))[1]
    return model(toy.toy_batch(ctx, step=step)).sum()


def _modules(model: nn.Module, workload: str) -> dict[str, nn.Module]:
    return {ROOT: model, **{name: model.get_submodule(name) for name in FORWARD[workload]}}


def set_targets(model: nn.Module, workload: str, direction: str, targets: dict[str, list[str]]) -> None:
    """``set_modules_to_{direction}_prefetch`` on each unit of ``targets`` (unit → the units it names)."""
    modules = _modules(model, workload)
    for unit, wanted in targets.items():
        setter = getattr(modules[unit], f"set_modules_to_{direction}_prefetch")
        setter([modules[t] for t in wanted])


def torch_post_forward_order(model: nn.Module) -> list[str]:
    """The root state's ``post_forward_order`` now, as unit names."""
    order = model._get_fsdp_state()._comm_ctx.post_forward_order
    return [unit_name(group._module_fqn) for group in order]


def described(events: Any) -> list[str]:
    return [e.describe() for e in events]


def gathers_of(forward: Any, backward: Any) -> dict[str, int]:
    """The all-gathers two collective recordings hold, forward and backward."""
    return {
        "forward": sum(c.op == "all_gather" for c in forward),
        "backward": sum(c.op == "all_gather" for c in backward),
    }


def one_step(
    ctx: RankContext, workload: str, reshard: bool | None, *, forward_targets: dict[str, list[str]] | None = None,
    backward_targets: dict[str, list[str]] | None = None, steps: int = 1,
) -> list[dict[str, Any]]:  # fmt: skip
    """Forward and backward, ``steps`` times on one model; per step what `run_step` returns."""
    model = build(ctx, workload, reshard)
    if forward_targets:
        set_targets(model, workload, "forward", forward_targets)
    if backward_targets:
        set_targets(model, workload, "backward", backward_targets)
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
            loss = loss_of(ctx, workload, model)
        memory.mark("after forward")
        order = torch_post_forward_order(model)
        with record_comm() as backward_comm:
            loss.backward()
        memory.mark("after backward")
    what = f"{workload}, reshard_after_forward={reshard}, step {step}: torch's post-forward order"
    require_equal(order, [*forward, ROOT], reason="post-forward-order", what=what, **where)
    return {"sequence": described(events), "post_forward": order, "all_gathers": gathers_of(forward_comm,
            backward_comm), "expected": expected, "where": where, "memory": memory.series.points}  # fmt: skip


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
