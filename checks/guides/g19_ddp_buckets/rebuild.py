"""rebuild-reorders and -at-4: the second forward's ``_rebuild_buckets()`` reorders the one bucket of iteration 1
by gradient-ready order (the guide's `ready-order`), after the broadcasts of its `rebuild-broadcasts`, and every
rank takes rank 0's layout."""

from __future__ import annotations

from typing import Any

import torch

from checks.expected import Expected
from checks.guides.g19_ddp_buckets.ddp_runs import ddp_of, flat, names_of, reducer_buckets, run_iterations
from checks.probes.grad_ready import ready_order, record_grad_ready
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.rank_ordered import RankOrderedBranches
from checks.workloads.toy import wrap_ddp


def rebuild_reorders(ctx: RankContext, ready: Expected, broadcasts: Expected) -> dict[str, Any]:
    """Until the second forward the one bucket holds the parameters in registration order; that forward's
    ``_rebuild_buckets()`` returns True once and leaves the buckets in the order the first backward made the
    gradients ready (the guide's ``ready``), after broadcasting the guide's ``broadcasts``; no other forward
    broadcasts. Where the ranks' orders differ, every rank takes rank 0's (`_rebuild_takes_rank_0s`)."""
    ddp = ddp_of(ctx, "linears")
    trace = run_iterations(ddp, ctx, "linears", 3)
    names = names_of(ddp)
    first_ready = ready_order(trace.ready, 1)
    registration = list(range(len(names)))
    require_equal(flat(trace.before[1]), registration, reason="not-registration-order",
                  what="the buckets before the second forward, flattened")  # fmt: skip
    require_equal(trace.rebuilt, [False, True, True], reason="rebuild-flag",
                  what="`_has_rebuilt_buckets` after each iteration")  # fmt: skip
    require_equal(flat(trace.after[1]), first_ready, reason="not-gradient-ready-order",
                  what="the rebuilt buckets, flattened, against iteration 1's gradient-ready order",
                  buckets=trace.after[1])  # fmt: skip
    said = [f"broadcast {c.numel} {c.dtype.removeprefix('torch.')}" for c in trace.forward_collectives(2)]
    broadcasts.require_rows(said, reason="rebuild-broadcasts", what="the second forward's collectives")
    others = [c.describe() for i in (1, 3) for c in trace.forward_collectives(i)]
    require_equal(others, [], reason="rebuild-broadcasts", what="collectives in the first and third forwards")
    order = [names[i] for i in first_ready]
    ready.require_rows(order, reason="ready-order-differs-from-guide", what="iteration 1's gradient-ready order")
    source = _rebuild_takes_rank_0s(ctx)
    return {
        "from_rank_0": source,
        "before": [[names[i] for i in b] for b in trace.before[1]],
        "after": [[names[i] for i in b] for b in trace.after[1]],
        "first_bucket": [names[i] for i in trace.after[1][0]],
        "ready_order": order,
        "broadcasts": said,
        "broadcast_elements": [c.numel for c in trace.forward_collectives(2)],
        "broadcast_bytes": sum(c.nbytes for c in trace.forward_collectives(2)),
    }


def _rebuild_takes_rank_0s(ctx: RankContext) -> dict[str, Any]:
    """The rebuild's broadcasts come from rank 0: on `RankOrderedBranches`, whose ranks make their gradients ready in
    different orders in the first backward, every rank's rebuilt buckets, flattened, are rank 0's order."""
    ddp = wrap_ddp(RankOrderedBranches().to(ctx.device), ctx)
    with record_grad_ready(ddp) as ready:
        for step in range(2):
            generator = torch.Generator().manual_seed(97 * step + ctx.rank)
            ddp(torch.randn(2, 8, generator=generator).to(ctx.device)).backward()
            ddp.zero_grad(set_to_none=True)
    orders = ctx.gather(ready_order(ready, 1))
    require(any(order != orders[0] for order in orders[1:]), "ready-orders-agree", "every rank made its gradients "
            "ready in rank 0's order: which rank the layout came from cannot be seen", orders=orders)  # fmt: skip
    layouts = ctx.gather(flat(reducer_buckets(ddp)))
    require_equal(layouts, [orders[0]] * ctx.world_size, reason="not-rank-0s-layout",
                  what="every rank's rebuilt buckets, flattened, against rank 0's gradient-ready order",
                  orders=orders)  # fmt: skip
    return {"ready_orders": orders, "layouts": layouts}
