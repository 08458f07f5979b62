"""What a granularity costs: mini_gpt tiny as one unit, one per block and one per Linear layer, each step's
largest all-gather, collectives, padding and unsharded peak against `checks.models.wrap.cost`, which reuses the
flat-parameter, communication and prefetch models, and against the guide's rows."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from checks.expected import Expected
from checks.guides.g20_auto_wrap.wrapping import mixed_precision_of, wrap_fsdp1
from checks.models import wrap as wm
from checks.probes.comm import record_comm
from checks.probes.events import record_events
from checks.probes.memory import account_memory
from checks.probes.memory_series import record_memory_series
from checks.ranks.context import RankContext
from checks.violation import require
from checks.workloads.edge import build, step_loss
from checks.workloads.module_tree import module_paths, tree_of
from checks.workloads.wrap_policies import model_policy, torch_policy

LR = 1e-3
GRANULARITIES: dict[str, dict[str, Any] | None] = {
    "one-unit": None,
    "per-block": {"kind": "module", "classes": ["Block"]},
    "per-linear": {"kind": "lambda", "types": ["Linear"], "except_paths": ["lm_head"]},
}


def _cost_row(cost: wm.Cost, units: int) -> str:
    """A granularity's cost as the guide's rows state it after its name: ``4 units, all-gathers <= 16020, peak
    142272 B, 7 AG + 4 RS, pad 0`` (elements, bytes, collectives per step, padding elements)."""
    return (f"{units} unit{'s' if units != 1 else ''}, all-gathers <= {cost.largest_all_gather}, peak "
            f"{cost.unsharded_peak} B, {cost.collectives['all_gather']} AG + {cost.collectives['reduce_scatter']} RS, "
            f"pad {cost.padding}")  # fmt: skip


def granularity_costs(ctx: RankContext, expected: Expected, param_dtype: str | None = None) -> dict[str, Any]:
    """mini_gpt tiny as one unit, one per block, one per Linear layer (the tied head left to the root): for each,
    a steady step's largest all-gather (elements), its collectives by op, and the flat parameters' padding are
    the model's (`checks.models.wrap.cost`); the unsharded peak of the step after (torch's memory tracker) is the
    model's bytes; the costs, written out, are the guide's rows."""
    element_bytes = 2 if param_dtype else 4
    # What the models predict, torch-free, against the rows first: a row then names what each run must show.
    costs = {}
    for label, spec in GRANULARITIES.items():
        predicted = wm.wrap(tree_of(build("gpt")), model_policy(spec))
        costs[label] = (wm.cost(predicted, ctx.world_size, element_bytes), len(predicted.units))
    stated = {label: _cost_row(cost, units) for label, (cost, units) in costs.items()}
    expected.require_values(stated, reason="costs-differ-from-guide", what="the costs, written out")
    series, observed = {}, {}
    for label, spec in GRANULARITIES.items():
        cost = costs[label][0]
        model = build("gpt", ctx.device)
        paths = module_paths(model)
        wrapped, _, _ = wrap_fsdp1(model, ctx, torch_policy(spec, paths), paths,
                                   mixed_precision=mixed_precision_of(param_dtype))  # fmt: skip
        run = _measure_steps(wrapped, ctx, label)
        series[label] = run.pop("series")
        seen = {"largest_all_gather": run["largest_all_gather"], "collectives": run["collectives"],
                "padding": _padding(wrapped), "unsharded_peak": run["unsharded_peak"]}  # fmt: skip
        want = {"largest_all_gather": cost.largest_all_gather, "collectives": cost.collectives,
                "padding": cost.padding, "unsharded_peak": cost.unsharded_peak}  # fmt: skip
        for key, value in want.items():
            expected.require(seen[key] == value, expected.row(label), f"{key.replace('_', '-')}-differs",
                             f"{label}: {key}: {seen[key]!r}, expected {value!r}", observed=seen[key], expected=value,
                             granularity=label)  # fmt: skip
        observed[label] = seen
    return {
        "costs": [f"{label}: {row}" for label, row in stated.items()],
        "observed": observed,
        "collectives_per_step": {label: sum(seen["collectives"].values()) for label, seen in observed.items()},
        "unsharded_peak": {label: seen["unsharded_peak"] for label, seen in observed.items()},
        "series": series,
    }


def _measure_steps(model: nn.Module, ctx: RankContext, label: str) -> dict[str, Any]:
    """Step 1 (lazy initialisation), step 2 recorded (collectives, FSDP events, a memory series), step 3 under
    torch's memory tracker (peaks by category)."""
    optim = torch.optim.AdamW(model.parameters(), lr=LR)

    def one(step: int) -> None:
        step_loss(model, ctx, "gpt", step).backward()
        optim.step()
        optim.zero_grad(set_to_none=True)

    one(0)
    # The events are not compared here; recording them is what `fsdp-readings timeline` draws.
    with record_comm() as comm, record_events(model, label=label), record_memory_series(model, optim) as recorder:
        recorder.mark("start")
        one(1)
        recorder.mark("after step")
    with account_memory(model, optim, peaks=True) as memory:
        one(2)
    require(memory.peak is not None, "no-peaks", f"no peak report: {memory.peak_unavailable}")
    gathers = comm.select("all_gather")
    return {
        "largest_all_gather": max(c.numel for c in gathers),
        "collectives": {op: comm.count(op) for op in ("all_gather", "reduce_scatter")},
        "unsharded_peak": memory.peak.peak.get("unsharded", 0),
        "series": recorder.series.points,
    }


def _padding(model: nn.Module) -> int:
    """Elements the flat parameters add, over every unit: padded unsharded size less the parameters'."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    total = 0
    for module in model.modules():
        if isinstance(module, FSDP) and module._handle:
            flat = module._handle.flat_param
            total += flat._padded_unsharded_size.numel() - sum(flat._numels)
    return total
