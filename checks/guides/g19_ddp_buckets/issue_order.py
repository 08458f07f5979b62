"""overlap-from-iteration-2 and -at-4: each bucket's all-reduce is issued as soon as its last gradient is ready,
so from the rebuild on bucket 0's overlaps the gradients still to come (the guide's `grammar-issue-order`), and the
first and last gradients to be ready are the guide's `grammar-ready-ends`."""

from __future__ import annotations

from typing import Any

from checks.expected import Expected
from checks.guides.g19_ddp_buckets.ddp_runs import ddp_of, flat, names_of, options_of, run_iterations
from checks.models import ddp_buckets as db
from checks.probes.grad_ready import ready_order
from checks.ranks.context import RankContext
from checks.violation import require, require_equal


def issue_order(ctx: RankContext, workload: str, expected: Expected, ends: Expected | None = None, *,
                options: dict[str, Any] | None = None, iterations: int = 3) -> dict[str, Any]:  # fmt: skip
    """Each bucket's all-reduce is issued as soon as its last gradient is ready: the gradients ready before
    bucket k's all-reduce are exactly buckets 0..k's. So with two buckets or more, bucket 0's all-reduce comes
    before the last gradient of the step; with one (iteration 1 by default), after all of them. ``expected``:
    the guide's rows, one per iteration; ``ends``: its first and last gradient to be ready."""
    options = options or {}
    ddp = ddp_of(ctx, workload, **options)
    trace = run_iterations(ddp, ctx, workload, iterations)
    names = names_of(ddp)
    lines, to_come = [], []
    for i in range(1, iterations + 1):
        ready = [(e.seq, int(e.target or -1)) for e in trace.ready.select("post_backward", iteration=i)]
        buckets = trace.after[i - 1]
        reduces = [c for c in trace.bucket_reduces(i) if c.dtype != "torch.int32"]  # not a used-parameter map
        for k, reduce in enumerate(reduces):
            before = sorted(index for seq, index in ready if seq < reduce.seq)
            require_equal(before, sorted(flat(buckets[: k + 1])), reason="not-issued-when-bucket-ready",
                          what=f"iteration {i}: gradients ready before bucket {k}'s all-reduce", iteration=i,
                          bucket=k)  # fmt: skip
        still = sum(1 for seq, _ in ready if seq > reduces[0].seq)
        to_come.append(still)
        if len(buckets) == 1:
            lines.append(f"iteration {i}: 1 all-reduce, after all {len(ready)} gradients")
        else:
            lines.append(f"iteration {i}: {len(buckets)} all-reduces, bucket 0's with {still} of {len(ready)} "
                         "gradients to come")  # fmt: skip
    rebuild_at = db.rebuild_iteration(options_of(options))  # None: the caps apply from iteration 1
    if rebuild_at is not None:
        require(to_come[0] == 0, "overlap-in-iteration-1", f"bucket 0 was all-reduced with {to_come[0]} gradients "
                "still to come in iteration 1, where DDP has one bucket", observed=to_come[0])  # fmt: skip
    # From the rebuild on the claim's model (larger than the first bucket) must overlap.
    late = [i for i in range(rebuild_at or 1, iterations + 1) if to_come[i - 1] == 0]
    require(not late, "no-overlap", f"iterations {late}: nothing was all-reduced before the last gradient",
            iterations=late, to_come=to_come)  # fmt: skip
    expected.require_rows(lines, reason="issue-order-differs-from-guide", what="the issue order per iteration")
    order = ready_order(trace.ready, iterations)
    first_and_last = [f"first ready: {names[order[0]]}", f"last ready: {names[order[-1]]}"]
    if ends is not None:
        ends.require_rows(first_and_last, reason="ready-ends-differ-from-guide", what="the first and last gradient")
    final = trace.after[-1]
    return {
        "lines": lines,
        "to_come": to_come,
        "first_bucket": [names[i] for i in final[0]],
        "last_bucket": [names[i] for i in final[-1]],
        "ready_ends": first_and_last,
    }
