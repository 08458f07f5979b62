"""Guide 13's peaks: SHARD_GRAD_OP against FULL_SHARD, the unsharded bytes each holds at its peak, from the
flat-parameter layout model."""

from __future__ import annotations

from typing import Any

from checks.models.flat_param import layout
from checks.naming import ROOT
from checks.probes.memory import account_memory
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.data_parallel import (
    BLOCKS,
    LR,
)
from checks.workloads.gpt import batch, fsdp1_gpt
from mini_gpt.train import make_optimizer


# -- peaks: SHARD_GRAD_OP against FULL_SHARD ------------------------------------------------------------------------
def _unsharded_unit_bytes(world_size: int) -> dict[str, int]:
    """Each unit's padded unsharded flat parameter in bytes (fp32, use_orig_params=True), by the layout model."""
    from checks.workloads.gpt import unit_numels

    return {unit: 4 * layout(numels, 4, world_size).padded_numel for unit, numels in unit_numels().items()}


def _peak_of(ctx: RankContext, strategy: str, backward_prefetch: str | None) -> dict[str, Any]:
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy

    model = fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy[strategy],
                      backward_prefetch=BackwardPrefetch[backward_prefetch] if backward_prefetch not in (None, "None")
                      else None)  # fmt: skip
    optim = make_optimizer(model, LR)
    for step in range(2):  # step 1 outside: lazy initialisation and the optimizer's state are one-time
        with account_memory(model, optim, peaks=step == 1) as mem:
            _, loss = model(*batch(ctx, step=step))
            loss.backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
    require(mem.peak is not None, "no-peaks", f"no peak report: {mem.peak_unavailable}", observed=mem.peak_unavailable)
    return {"before": mem.before.by_category, "after": mem.after.by_category, "peak": dict(mem.peak.peak)}


def shard_grad_op_peak(ctx: RankContext, backward_prefetch: str | None, held_blocks: int,
                       temp_blocks: int) -> dict[str, Any]:  # fmt: skip
    """SHARD_GRAD_OP and FULL_SHARD hold the same bytes between steps; SHARD_GRAD_OP's unsharded peak is larger by
    exactly the blocks it keeps unsharded beyond the ``held_blocks`` FULL_SHARD holds at its peak (the root is
    unsharded at both peaks). Every other category's peak is the same, except torch's tracker's ``temp``, which may
    differ by up to ``temp_blocks`` blocks' unsharded bytes (when a unit's gradient temporaries die is not
    deterministic); the total peaks differ by the unsharded difference within that same bound."""
    units = _unsharded_unit_bytes(ctx.world_size)
    blocks = [units[b] for b in BLOCKS]
    expected = {
        "FULL_SHARD": units[ROOT] + sum(sorted(blocks, reverse=True)[:held_blocks]),
        "SHARD_GRAD_OP": units[ROOT] + sum(blocks),
    }
    temp_bound = temp_blocks * units["blocks.0"]
    runs = {s: _peak_of(ctx, s, backward_prefetch) for s in expected}
    fs, sgo = runs["FULL_SHARD"], runs["SHARD_GRAD_OP"]
    for moment in ("before", "after"):
        require_equal(sgo[moment], fs[moment], reason="persistent-state-differs",
                      what=f"bytes by category {moment} the step, SHARD_GRAD_OP vs FULL_SHARD",
                      moment=moment)  # fmt: skip
    observed = {s: r["peak"].get("unsharded", 0) for s, r in runs.items()}
    require_equal(observed, expected, reason="unsharded-peak", what="peak unsharded bytes")
    difference = observed["SHARD_GRAD_OP"] - observed["FULL_SHARD"]
    others = {k: sgo["peak"].get(k, 0) - fs["peak"].get(k, 0) for k in sorted(set(sgo["peak"]) | set(fs["peak"]))
              if k not in ("unsharded", "total")}  # fmt: skip
    bounds = {k: temp_bound if k == "temp" else 0 for k in others}
    beyond = {k: v for k, v in others.items() if abs(v) > bounds[k]}
    require(not beyond, "other-peaks-differ", f"peaks other than unsharded differ beyond {bounds}: {beyond}",
            observed=others, bound=temp_bound)  # fmt: skip
    total = sgo["peak"]["total"] - fs["peak"]["total"]
    require(abs(total - difference) <= temp_bound, "total-peak-difference", f"total peaks differ by {total}, the "
            f"unsharded peaks by {difference}: more than {temp_bound} apart", observed=total, expected=difference,
            bound=temp_bound)  # fmt: skip
    return {
        "unsharded_peak": observed,
        "difference": difference,
        "difference_in_blocks": difference / units["blocks.0"],
        "total_peak": {s: r["peak"]["total"] for s, r in runs.items()},
        "total_difference": total,
        "other_differences": others,
        "peaks": {s: r["peak"] for s, r in runs.items()},
        "persistent": fs["after"],
    }
