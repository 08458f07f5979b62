"""The buckets of every iteration against the bucket model, and their elements against the guide's blocks
(default-buckets and -at-4, small-cap-buckets, last-bucket-cap, find-unused-caps-from-start, cap-list-from-start,
static-graph-rebuilds-later, grammar-buckets, tiny-small-cap-buckets)."""

from __future__ import annotations

from typing import Any

from checks.expected import Expected
from checks.guides.g19_ddp_buckets.ddp_runs import (
    ddp_of,
    environment,
    names_of,
    options_of,
    params_of,
    run_iterations,
)
from checks.models import ddp_buckets as db
from checks.probes.grad_ready import ready_order
from checks.ranks.context import RankContext
from checks.violation import require, require_equal


def _numbers(params: list[db.Param], buckets_per_iteration: list[list[list[int]]]) -> list[str]:
    """The guide's way of writing a layout: ``iteration 2: 263168 131584`` (elements per bucket, in order)."""
    return [f"iteration {i}: " + " ".join(str(n) for n in db.bucket_numels(params, buckets))
            for i, buckets in enumerate(buckets_per_iteration, start=1)]  # fmt: skip


def buckets_match_model(ctx: RankContext, workload: str, expected: Expected, options: dict[str, Any] | None = None,
                        iterations: int = 3, *, env: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """In every iteration the reducer's buckets are the model's (from the parameters' sizes, the settings, ``env``
    and the gradient-ready order our hooks saw); the backward all-reduces one bucket each, in bucket order, plus the
    used-parameter map where the model says; the rebuild's forward broadcasts P + 1 and B int32 from
    ``_pre_forward`` and no other forward communicates. The elements per bucket are the guide's (``expected``, a
    row per iteration). ``env`` is set in the ranks' environment from construction to the last backward, then
    restored."""
    options = options or {}
    with environment(env):
        ddp = ddp_of(ctx, workload, **options)
        trace = run_iterations(ddp, ctx, workload, iterations)
    params = params_of(ddp)
    orders = [ready_order(trace.ready, i) for i in range(1, iterations + 1)]
    require(all(order == orders[0] for order in orders), "ready-order-changed", "gradients became ready in a "
            "different order in some iteration: the model assumes one order", orders=orders)  # fmt: skip
    plan = db.plan(params, orders[0], options_of(options, env), iterations)
    for i, (step, buckets) in enumerate(zip(plan, trace.after, strict=True), start=1):
        require_equal(buckets, step.buckets, reason="buckets-differ-from-model", what=f"iteration {i}: buckets",
                      iteration=i)  # fmt: skip
        reduces = [(c.numel, c.dtype.removeprefix("torch.")) for c in trace.bucket_reduces(i)]
        require_equal(reduces, step.all_reduces, reason="all-reduces-differ-from-model",
                      what=f"iteration {i}: all-reduces (elements, dtype)", iteration=i)  # fmt: skip
        _require_rebuild_broadcasts(trace.forward_collectives(i), step.broadcasts, i)
    observed = _numbers(params, trace.after)
    expected.require_rows(observed, reason="numbers-differ-from-guide", what="elements per bucket")
    return {
        "buckets": observed,
        "bucket_count": [len(b) for b in trace.after],
        "layouts": trace.after,
        "ready_order": [names_of(ddp)[i] for i in orders[0]],
        "broadcasts": [[c.numel for c in trace.forward_collectives(i)] for i in range(1, iterations + 1)],
        "all_reduces": [[c.numel for c in trace.bucket_reduces(i)] for i in range(1, iterations + 1)],
    }


def _require_rebuild_broadcasts(collectives: list[Any], expected: list[int], iteration: int) -> None:
    observed = [(c.op, c.numel, c.dtype, c.caller.rsplit(":", 1)[-1]) for c in collectives]
    want = [("broadcast", n, "torch.int32", "DistributedDataParallel._pre_forward") for n in expected]
    require_equal(observed, want, reason="broadcasts-differ-from-model",
                  what=f"iteration {iteration}: collectives in forward (op, elements, dtype, caller)",
                  iteration=iteration)  # fmt: skip
