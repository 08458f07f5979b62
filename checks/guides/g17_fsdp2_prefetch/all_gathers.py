"""How many all-gathers a step issues, and from which hook: by ``reshard_after_forward`` with and without
prefetch targets, with a setting per unit (an int resharding to a smaller mesh), and with a root that holds no
parameter of its own."""

from __future__ import annotations

from typing import Any

from checks.expected import Expected
from checks.guides.g17_fsdp2_prefetch.steps import (
    BLOCKS,
    NO_INPUT_GRAD,
    RESHARD,
    described,
    gathers_of,
    loss_of,
    matches_model,
    one_step,
    torch_post_forward_order,
)
from checks.models.fsdp2_prefetch import all_gathers_by_formula, lookahead, prefetches, step_sequence
from checks.naming import ROOT
from checks.probes.comm import record_comm
from checks.probes.events import record_events
from checks.ranks.context import RankContext
from checks.violation import require
from checks.workloads import toy
from checks.workloads.gpt import batch
from mini_gpt import preset


def all_gathers_per_step(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """All-gathers issued by one step's forward and backward, by ``reshard_after_forward``, with no explicit
    targets and with a lookahead of 2 both ways: the guide's derivation, the same with and without prefetch."""
    out: dict[str, Any] = {}
    for label, reshard in RESHARD.items():
        row = expected.row(label)
        formula = all_gathers_by_formula(len(BLOCKS), reshard)
        derived = {**formula, "step": sum(formula.values())}
        stated = {column: int(cell) for column, cell in expected.cells(row).items() if column in derived}
        expected.require(derived == stated, row, "formula-differs-from-guide", f"reshard_after_forward={label}: "
                         f"the formula {derived}, the guide's row {stated}", observed=derived,
                         expected=stated)  # fmt: skip
        for config in ("implicit", "lookahead-2"):
            targets = {}
            if config != "implicit":
                targets = {"forward_targets": lookahead(BLOCKS, ROOT, 2, "forward"),
                           "backward_targets": lookahead(BLOCKS, ROOT, 2, "backward")}  # fmt: skip
            (step,) = one_step(ctx, "gpt", reshard, **targets)
            seen = step["all_gathers"]
            expected.require(seen == formula, row, "all-gathers", f"reshard_after_forward={label}, {config}: "
                             f"all-gathers: {seen!r}, expected {formula!r}", observed=seen, expected=formula,
                             reshard=label, config=config)  # fmt: skip
            out[f"{label} {config}"] = {**seen, "total": sum(seen.values())}
    return out


def _setting(text: str) -> bool | int | None:
    return {"True": True, "False": False, "None": None}[text] if text in ("True", "False", "None") else int(text)


AFTER_FORWARD = {"free": "freed", "reshard": "resharded to a smaller mesh"}


def per_unit_settings(ctx: RankContext, settings: dict[str, str], expected: Expected) -> dict[str, Any]:
    """mini_gpt tiny with each unit's own ``reshard_after_forward`` (``settings``: unit → "True", "False",
    "None" or an int), passed to its own ``fully_shard`` call: the step's whole event sequence and its
    all-gathers are `step_sequence`'s for that mapping; what each unit does after forward and which backward
    prefetches issue an all-gather are the guide's rows."""
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
    sequence = step_sequence(BLOCKS, ROOT, reshard_after_forward=parsed, world_size=ctx.world_size)
    with record_events(model, label="per-unit settings") as events:
        with record_comm() as forward_comm:
            loss = model(*batch(ctx))[1]
        with record_comm() as backward_comm:
            loss.backward()
    gathers = gathers_of(forward_comm, backward_comm)
    where = {"settings": " ".join(f"{u}={t}" for u, t in settings.items())}
    step = {"sequence": described(events), "expected": sequence, "all_gathers": gathers, "where": where}
    matches_model(step)
    split = next(i for i, e in enumerate(step["sequence"]) if e.startswith("pre_backward "))
    forward_events = step["sequence"][:split]
    observed = {}
    for unit in (ROOT, *BLOCKS):
        done = [AFTER_FORWARD[kind] for kind in AFTER_FORWARD if f"{kind} {unit}" in forward_events]
        observed[unit] = f"{done[0] if done else 'kept'} after forward"
    observed["backward prefetches"] = " ".join(prefetches(step["sequence"], phase="backward"))
    expected.require_values(observed, reason="settings-differ-from-guide", what="each unit after forward, and "
                            "backward")  # fmt: skip
    return {"lines": [f"{key}: {value}" for key, value in observed.items()], "all_gathers": gathers,
            "sequence": step["sequence"]}  # fmt: skip


def root_without_parameters(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """The toy with its last layer made a unit too, so the root holds no parameter of its own: the step's whole
    event sequence and all-gathers are `step_sequence`'s with ``root_params=False``; torch's post-forward order,
    the backward's prefetches and the root's own events are the guide's rows."""
    model = toy.wrap_fsdp2(toy.toy_model(ctx.device), ctx, units=("0", "1", "2"))
    require(model._get_fsdp_state()._fsdp_param_group is None, "root-has-a-group",
            "the root holds parameters of its own: the case is not built")  # fmt: skip
    forward = ("0", "1", "2")
    sequence = step_sequence(forward, ROOT, no_input_grad=NO_INPUT_GRAD["toy"], root_params=False)
    with record_events(model, label="a root without parameters") as events:
        with record_comm() as forward_comm:
            loss = loss_of(ctx, "toy", model)
        order = torch_post_forward_order(model)
        with record_comm() as backward_comm:
            loss.backward()
    gathers = gathers_of(forward_comm, backward_comm)
    step = {"sequence": described(events), "expected": sequence, "all_gathers": gathers, "where": {"root": "no params"}}
    matches_model(step)
    root_events = [e.split()[0] for e in step["sequence"] if e.split()[-1] == ROOT]
    callback = [e.split()[-1] for e in step["sequence"] if e.startswith("final_callback ")]
    observed = {
        "post-forward order": " ".join(order),
        "backward prefetches": " ".join(prefetches(step["sequence"], phase="backward")),
        "root events": " ".join(root_events),
        "final callback queued by": " ".join(callback),
    }
    expected.require_values(observed, reason="root-differs-from-guide", what="a root without parameters")
    return {"lines": [f"{key}: {value}" for key, value in observed.items()], "all_gathers": gathers}
