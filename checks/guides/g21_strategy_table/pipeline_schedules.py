"""Pipeline parallel, the bubble in slots: each stage's recorded order against `checks.models.pipeline`'s for
GPipe and 1F1B, the slots and microbatches held that order leaves (the ``*-bubble-*`` blocks), torch's own
``pipeline_order`` (the ``*-ir-*`` blocks); both schedules against one process on the same microbatches."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from checks.expected import Expected
from checks.guides.g21_strategy_table.ratios import ratio
from checks.models import pipeline as pl
from checks.probes.stages import actions, held_at_most, record_stage_actions
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.pipeline_stages import MICROBATCHES, Pipeline, pp_data, pp_layers, pp_loss, stage_slice


def pp_schedule(ctx: RankContext, schedule: str, torch_ir: Expected, bubble: Expected) -> dict[str, Any]:
    """The stages' recorded orders (the probes' record of their forwards and backwards), run one slot each,
    leave the bubble (p − 1)/(m + p − 1): every stage idle 2(p − 1) of 2(m + p − 1) slots. Each stage's order is
    exactly the model's for ``schedule``, and it holds at most the model's microbatches in flight. Torch's own
    ``pipeline_order`` has no idle (``None``) entry; without its REDUCE_GRAD (and 2.15's WAIT_REDUCE_GRAD) it is
    the guide's ``torch_ir`` (``rank <r>: <actions>``). ``bubble``: the guide's rows on slots, bubble and
    microbatches held; a model comparison that fails names those the same run makes false."""
    pipe = Pipeline(ctx, schedule)
    pipe.step(0)
    with record_stage_actions(label=f"{schedule} step 2") as stage_log:
        pipe.step(1)
    order = actions(stage_log)
    orders = ctx.gather(order)
    held = dict(enumerate(ctx.gather(held_at_most(stage_log))))  # gathered on every rank before any check fails
    p, m = ctx.world_size, MICROBATCHES
    slots = pl.simulate({r: [pl.Action(a[0], int(a[1:])) for a in o] for r, o in enumerate(orders)})
    written = {r: [str(a or ".") for a in row] for r, row in slots.items()}
    idle_share = pl.bubble(slots)
    observed = {f"{schedule}, p={p}, m={m}": f"{len(slots[0])} slots; bubble {ratio(idle_share)}",
                f"{schedule} idle slots": " ".join(str(pl.idle_slots(slots[r])) for r in sorted(slots)),
                f"{schedule} in flight": " ".join(str(held[r]) for r in sorted(held))}  # fmt: skip
    model_orders = pl.orders(schedule, p, m)
    with bubble.naming_false_rows(partial(bubble.differing_values, observed)):
        # The bubble first, from what ran: a schedule that runs another order may still leave the textbook bubble
        # (GPipe's and 1F1B's orders both do), and one that leaves another bubble is caught as such.
        require_equal(idle_share, pl.bubble_formula(p, m), reason="bubble-differs-from-formula",
                      what="idle slots over all slots", slots=written)  # fmt: skip
        for stage, stage_order in enumerate(orders):
            require_equal(stage_order, [str(a) for a in model_orders[stage]], reason="order-differs-from-model",
                          what=f"stage {stage}: the order of its forwards and backwards", stage=stage)  # fmt: skip
    ir = pipe.schedule.pipeline_order or {}
    idle = {r: sum(1 for a in entries if a is None) for r, entries in ir.items()}  # every rank holds every rank's
    require(not any(idle.values()), "ir-has-idle-slots", f"pipeline_order holds None entries: {idle}",
            observed=idle)  # fmt: skip
    ir_lines = [f"rank {r}: " + " ".join(str(a).removeprefix(str(r)) for a in ir.get(r, [])
                                         if a is not None and "REDUCE_GRAD" not in str(a))
                for r in range(p)]  # fmt: skip
    torch_ir.require_rows(ir_lines, reason="ir-differs-from-guide", what="torch's pipeline_order, per rank")
    want_held = {r: pl.in_flight(o) for r, o in model_orders.items()}
    with bubble.naming_false_rows(partial(bubble.differing_values, observed)):
        require_equal(held, want_held, reason="in-flight-differs-from-model",
                      what="microbatches held at once, by stage")  # fmt: skip
    bubble.require_values(observed, reason="schedule-differs-from-guide", what="slots, bubble and microbatches held")
    return {"lines": [f"{key}: {value}" for key, value in observed.items()], "order": order, "ir": ir_lines,
            "bubble": ratio(idle_share), "slots": written, "held": held}  # fmt: skip


def pp_equivalence(ctx: RankContext, steps: int = 2) -> dict[str, Any]:
    """GPipe and 1F1B against one process that accumulates the same microbatches' gradients and divides by m,
    ``steps`` SGD steps: each microbatch's loss is the one process's on that microbatch, and each stage's gradients
    and updated parameters are its layers' in the one process, bit for bit; so GPipe and 1F1B agree bitwise."""
    reference = pp_layers().to(ctx.device)
    mine = stage_slice(ctx.rank, ctx.world_size)
    report: dict[str, Any] = {}
    ref_optim = torch.optim.SGD(reference.parameters(), lr=0.1)
    pipes = {s: Pipeline(ctx, s) for s in pl.SCHEDULES}
    optims = {s: torch.optim.SGD(pipe.module.parameters(), lr=0.1) for s, pipe in pipes.items()}
    for step in range(steps):
        x, y = (t.to(ctx.device) for t in pp_data(step))
        ref_losses = []
        for xc, yc in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES), strict=True):
            ref_losses.append(pp_loss(reference(xc), yc))
            ref_losses[-1].backward()  # accumulated microbatch by microbatch, as a stage does ...
        for param in reference.parameters():
            param.grad.div_(MICROBATCHES)  # ... then divided by m, as `scale_grads` does
        want_grads = [p.grad.clone() for p in reference[mine].parameters()]
        ref_optim.step()
        ref_optim.zero_grad(set_to_none=True)
        want_params = [p.detach().clone() for p in reference[mine].parameters()]
        for schedule, pipe in pipes.items():
            losses = pipe.step(step)
            if ctx.rank == ctx.world_size - 1:
                require_equal(losses, [float(v) for v in ref_losses], reason="losses-differ",
                              what=f"{schedule} step {step + 1}: each microbatch's loss", schedule=schedule,
                              step=step + 1)  # fmt: skip
            grads = [p.grad for p in pipe.module.parameters()]
            differing = sum(int((g != w).sum()) for g, w in zip(grads, want_grads, strict=True))
            require(differing == 0, "gradients-differ", f"{schedule} step {step + 1}: {differing} gradient elements "
                    "differ from one process's", schedule=schedule, step=step + 1, observed=differing)  # fmt: skip
            optims[schedule].step()
            optims[schedule].zero_grad(set_to_none=True)
            after = [p.detach() for p in pipe.module.parameters()]
            differing = sum(int((a != w).sum()) for a, w in zip(after, want_params, strict=True))
            require(differing == 0, "parameters-differ", f"{schedule} step {step + 1}: {differing} parameter "
                    "elements differ", schedule=schedule, step=step + 1, observed=differing)  # fmt: skip
            report.setdefault(schedule, []).append(losses)
    return {"losses": report, "stage_parameters": sum(p.numel() for p in pipes["gpipe"].module.parameters())}
