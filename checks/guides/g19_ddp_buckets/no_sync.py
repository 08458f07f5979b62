"""no-sync-accumulates and -at-4: inside ``no_sync`` no micro-step all-reduces; the synced one all-reduces each
bucket once and leaves every rank the mean over ranks of its accumulated gradients."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from checks.guides.g19_ddp_buckets.ddp_runs import LR, ddp_of, loss_of, model_of, params_of, reducer_buckets
from checks.models import ddp_buckets as db
from checks.numerics import pairwise_sums
from checks.probes.comm import record_comm
from checks.ranks.context import RankContext
from checks.violation import require, require_equal


def no_sync_accumulates(ctx: RankContext, micro_steps: int = 3, rounds: int = 2,
                        bucket_cap_mb: float = 0.05) -> dict[str, Any]:  # fmt: skip
    """``rounds`` rounds of ``micro_steps`` micro-batches on mini_gpt tiny, all but the last inside ``no_sync``:
    no micro-step inside it all-reduces; the last one all-reduces one bucket each, and leaves every rank the mean
    over ranks of its accumulated local gradients (an unwrapped replica's, gathered), exactly: at N=2 the one fp32
    value, at N=4 one of the pairwise summation orders. The rebuild's broadcasts, due after round 1, come in the
    first forward of round 2, inside ``no_sync``, and no other micro-step broadcasts."""
    ddp = ddp_of(ctx, "tiny", bucket_cap_mb=bucket_cap_mb)
    replica = model_of(ctx, "tiny")
    optim = torch.optim.AdamW(ddp.parameters(), lr=LR)
    report: list[dict[str, Any]] = []
    for r in range(rounds):
        replica.load_state_dict(ddp.module.state_dict())
        replica.zero_grad(set_to_none=True)
        optim.zero_grad(set_to_none=True)
        collectives = []
        for m in range(micro_steps):
            step = r * micro_steps + m
            synced = m == micro_steps - 1
            accumulate = contextlib.nullcontext() if synced else ddp.no_sync()
            with record_comm() as comm, accumulate:
                loss_of(ddp, ctx, "tiny", step).backward()
            loss_of(replica, ctx, "tiny", step).backward()
            collectives.append([(c.op, c.numel) for c in comm])
        buckets = reducer_buckets(ddp)
        inside = [c for micro in collectives[:-1] for c in micro if c[0] != "broadcast"]
        require_equal(inside, [], reason="all-reduce-inside-no-sync", what=f"round {r + 1}: collectives inside "
                      "no_sync, besides the rebuild's broadcasts", round=r + 1)  # fmt: skip
        synced_reduces = [n for op, n in collectives[-1] if op == "all_reduce"]
        expected_reduces = db.bucket_numels(params_of(ddp), buckets)
        require_equal(synced_reduces, expected_reduces, reason="synced-step-all-reduces",
                      what=f"round {r + 1}: the synced micro-step's all-reduces (elements)", round=r + 1)  # fmt: skip
        _require_mean_of_local(ctx, ddp, replica, r + 1)
        broadcasts = [[n for op, n in micro if op == "broadcast"] for micro in collectives]
        # The rebuild is due once round 1's synced backward recorded the ready order: round 2's first forward.
        rebuild = [len(params_of(ddp)) + 1, len(buckets)] if r == 1 else []
        require_equal(broadcasts, [rebuild] + [[]] * (micro_steps - 1), reason="rebuild-broadcasts",
                      what=f"round {r + 1}: broadcasts per micro-step (elements)", round=r + 1)  # fmt: skip
        report.append({"collectives": collectives, "buckets": len(buckets), "broadcasts": broadcasts})
        optim.step()
    return {"rounds": report, "inside_no_sync": [[m for m in rnd["collectives"][:-1]] for rnd in report]}


def _require_mean_of_local(ctx: RankContext, ddp: nn.Module, replica: nn.Module, round_: int) -> None:
    """Every gradient element times N is a sum, in some pairwise order, of the ranks' local accumulations."""
    local = torch.cat([p.grad.detach().flatten() for p in replica.parameters()]).cpu()
    everyone = [torch.empty_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(everyone, local)
    reduced = torch.cat([p.grad.detach().flatten() for p in ddp.module.parameters()]).cpu()
    sums = torch.stack(pairwise_sums(everyone))
    unexplained = int((~(sums == reduced * ctx.world_size).any(dim=0)).sum())
    worst = float((reduced - sums[0] / ctx.world_size).abs().max())
    require(unexplained == 0, "not-the-whole-batch-gradient", f"round {round_}: {unexplained} gradient elements are "
            "not the mean of the ranks' accumulated gradients", round=round_, observed=unexplained,
            max_abs_diff=worst)  # fmt: skip
