"""gradient-as-bucket-view: with the option every gradient views its bucket's storage at the model's offset, and
gradients and buckets hold the bytes of the guide's `bucket-view-bytes`, one copy fewer than without it."""

from __future__ import annotations

from typing import Any

from checks.expected import Expected
from checks.guides.g19_ddp_buckets.ddp_runs import ddp_of, loss_of, params_of, reducer_buckets
from checks.models import ddp_buckets as db
from checks.probes.comm import record_comm
from checks.ranks.context import RankContext
from checks.violation import require, require_equal


def grads_view_buckets(ctx: RankContext, expected: Expected, iterations: int = 3) -> dict[str, Any]:
    """After a steady step with ``gradient_as_bucket_view=True`` every gradient is a view into the storage its
    bucket's all-reduce moved, at the model's offset; without it no gradient shares a storage with a bucket. The
    distinct bytes of gradients and buckets are then 4|θ| and 2·4|θ|: the guide's rows (``expected``)."""
    totals, report = [], {}
    for view in (True, False):
        ddp = ddp_of(ctx, "linears", gradient_as_bucket_view=view)
        for step in range(iterations):
            ddp.zero_grad(set_to_none=True)
            with record_comm() as comm:
                loss_of(ddp, ctx, "linears", step).backward()
        params, buckets = params_of(ddp), reducer_buckets(ddp)
        grads = [p.grad for p in ddp.module.parameters()]
        reduces = comm.select("all_reduce")
        held = {g.untyped_storage().data_ptr(): g.untyped_storage().nbytes() for g in grads}
        bucket_storages = {c.storages[0]: c.nbytes for c in reduces}
        if view:
            for k, (bucket, reduce) in enumerate(zip(buckets, reduces, strict=True)):
                where = [(grads[i].untyped_storage().data_ptr(), grads[i].storage_offset()) for i in bucket]
                want = [(reduce.storages[0], offset) for offset in db.view_offsets(params, bucket)]
                require_equal(where, want, reason="gradient-not-a-bucket-view", what=f"bucket {k}: (storage, "
                              "offset) of each gradient against its all-reduce's storage", bucket=k)  # fmt: skip
        else:
            shared = sorted(set(held) & set(bucket_storages))
            require_equal(shared, [], reason="gradient-is-a-bucket-view",
                          what="storages both a gradient and an all-reduced bucket hold")  # fmt: skip
        total = sum({**held, **bucket_storages}.values())
        totals.append(f"{'with' if view else 'without'} gradient_as_bucket_view: {total} bytes")
        report["with" if view else "without"] = {"bytes": total, "grad_storages": len(held),
                                                 "buckets": len(bucket_storages)}  # fmt: skip
    gradient_bytes = sum(p.nbytes for p in params_of(ddp))
    saved = report["without"]["bytes"] - report["with"]["bytes"]
    require(saved == gradient_bytes, "saving-not-the-gradients", f"gradient_as_bucket_view saves {saved} bytes, the "
            f"gradients are {gradient_bytes}", observed=saved, expected=gradient_bytes)  # fmt: skip
    expected.require_rows(totals, reason="bytes-differ-from-guide", what="distinct bytes of gradients and buckets")
    return {**report, "saved": saved, "lines": totals}
