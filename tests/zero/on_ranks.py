"""Rank-side helpers for tests/zero: run the reference ZeRO on mini_gpt tiny and report what happened."""

from __future__ import annotations

from typing import Any

from checks.probes.comm import record_comm
from checks.ranks.context import RankContext
from checks.workloads.gpt import batch
from checks.zero import STAGES
from mini_gpt import GPT, preset

BLOCKS = ("blocks.0", "blocks.1", "blocks.2")


def _engine(ctx: RankContext, stage: int) -> Any:
    return STAGES[stage](GPT(preset("tiny"), seed=0).to(ctx.device), BLOCKS)


def collectives(ctx: RankContext, stage: int) -> dict[str, dict[str, int]]:
    engine = _engine(ctx, stage)
    x, y = batch(ctx)
    counts = {op: {"forward": 0, "backward": 0, "step": 0} for op in ("reduce_scatter", "all_gather", "all_reduce")}
    for phase in ("forward", "backward", "step"):
        with record_comm() as comm:
            if phase == "forward":
                _, loss = engine.model(x, y)
            elif phase == "backward":
                loss.backward()
            else:
                engine.step()
        for c in comm:
            counts[c.op][phase] += 1
    return counts


def zero3_gathered(ctx: RankContext) -> dict[str, list[str]]:
    engine = _engine(ctx, 3)

    def gathered() -> list[str]:
        return [g.name for g in engine.groups if g.full.untyped_storage().nbytes()]

    _, loss = engine.model(*batch(ctx))
    after_forward = gathered()
    loss.backward()
    return {"after forward": after_forward, "after backward": gathered()}


def full_grads_after_backward(ctx: RankContext) -> dict[int, int]:
    out = {}
    for stage in STAGES:
        engine = _engine(ctx, stage)
        _, loss = engine.model(*batch(ctx))
        loss.backward()
        out[stage] = sum(p.grad is not None for p in engine.model.parameters())
    return out
