"""Guide 10's run of micro-batches: what each step of FULL_SHARD, SHARD_GRAD_OP and DDP communicates inside and
outside ``no_sync``, against `checks.models.comm_volume` and the guide's counts (expect `no-sync-steps`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import ShardingStrategy

from checks.expected import Expected
from checks.guides.g10_no_sync_and_frozen_params.recording import recorded_step
from checks.naming import ROOT
from checks.probes.by_unit import collectives_by_unit
from checks.probes.comm import record_comm
from checks.ranks.context import RankContext
from checks.violation import require_equal
from checks.workloads.gpt import batch, ddp_gpt, fsdp1_gpt, unit_numels
from mini_gpt.train import make_optimizer

SHORT = {"full-shard": "FULL_SHARD", "shard-grad-op": "SHARD_GRAD_OP", "ddp": "DDP"}


def _strategy_model(ctx: RankContext, strategy: str) -> nn.Module:
    if strategy == "ddp":
        return ddp_gpt(ctx)
    return fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy[SHORT[strategy]])


def _step_collectives(model: nn.Module, strategy: str, x: torch.Tensor, y: torch.Tensor) -> dict[str, list[str]]:
    """One forward and backward's collectives by kind: ``unit elements`` per all-gather (forward, backward) and
    reduce-scatter, and the elements of each all-reduce."""
    if strategy == "ddp":
        with record_comm() as comm:
            model(x, y)[1].backward()
        return {
            "forward": [],
            "backward": [],
            "reduce": [],
            "all_reduce": [str(c.numel) for c in comm.select("all_reduce")],
        }
    comm, events = recorded_step(model, x, y)
    return {
        "forward": collectives_by_unit(comm, events, "all_gather", in_backward=False),
        "backward": collectives_by_unit(comm, events, "all_gather", in_backward=True),
        "reduce": collectives_by_unit(comm, events, "reduce_scatter"),
        "all_reduce": [str(c.numel) for c in comm.select("all_reduce")],
    }


def no_sync_steps(ctx: RankContext, strategies: list[str], syncs: list[bool], expected: Expected) -> dict[str, Any]:
    """A run of steps, step i inside ``no_sync()`` unless ``syncs[i]``, the optimizer stepping after each synced
    one: every step's collectives (unit and elements of each all-gather and reduce-scatter, elements all-reduced)
    are `checks.models.comm_volume.accumulation_steps`' for the strategy, as multisets per kind (guide 06 and the
    claims of `no_sync_backward` hold their order); the guide's rows (``expected``, ``<strategy> <step> <sync>:
    <counts>``) count them."""
    from contextlib import nullcontext

    from checks.models.comm_volume import accumulation_steps

    shapes = {unit: [(n,) for n in numels] for unit, numels in unit_numels().items()}
    counted: dict[str, str] = {}
    observed: dict[str, list[dict[str, int]]] = {}
    for strategy in strategies:
        model = _strategy_model(ctx, strategy)
        optim = make_optimizer(model, 1e-3)
        model_steps = accumulation_steps(strategy, shapes, ctx.world_size, syncs, root=ROOT)
        for i, (sync, volume) in enumerate(zip(syncs, model_steps, strict=True)):
            with nullcontext() if sync else model.no_sync():
                seen = _step_collectives(model, strategy, *batch(ctx, step=i))
            if sync:
                optim.step()
                optim.zero_grad(set_to_none=True)
            want = {
                "forward": [f"{o.unit} {o.numel}" for o in volume.ops if o.op == "all_gather" and not o.backward],
                "backward": [f"{o.unit} {o.numel}" for o in volume.ops if o.op == "all_gather" and o.backward],
                "reduce": [f"{o.unit} {o.numel}" for o in volume.ops if o.op == "reduce_scatter"],
                "all_reduce": [str(o.numel) for o in volume.ops if o.op == "all_reduce"],
            }
            label = "sync" if sync else "no_sync"
            for kind, wanted in want.items():
                require_equal(sorted(seen[kind]), sorted(wanted), reason=f"{kind.replace('_', '-')}-differs-from-model",
                              what=f"{strategy} step {i + 1} ({label}): {kind} collectives", strategy=strategy,
                              step=i + 1)  # fmt: skip
            counts = {kind: len(v) for kind, v in seen.items()}
            observed.setdefault(strategy, []).append(counts)
            reduced = sum(int(n) for n in seen["all_reduce"])
            counted[f"{strategy} {i + 1} {label}"] = (
                f"AG {counts['forward']}+{counts['backward']}, RS {counts['reduce']}, AR {reduced:,}"
            )
        del model, optim
    expected.require_values(counted, reason="steps-differ-from-guide", what="each step's collectives, counted")
    return {"steps": observed, "lines": [f"{step}: {counts}" for step, counts in counted.items()]}
