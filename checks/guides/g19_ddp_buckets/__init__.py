"""Checks for guide 19, DDP's gradient buckets: their capacities, the one bucket of iteration 1, the rebuild after
it, when each bucket's all-reduce is issued, ``no_sync``, ``gradient_as_bucket_view``, comm hooks, and replicas
that stay identical.

DDP's buckets are read from its reducer (``reducer._get_zeros_like_grad_buckets()``: one `GradBucket` per bucket,
its parameters in bucket order), its collectives at the dispatcher (`checks.probes.comm.record_comm`, where DDP's
C++ all-reduces and the rebuild's broadcasts appear), and the moment each gradient is ready from a
post-accumulate-grad hook per parameter on the same clock (`checks.probes.grad_ready`). Expected layouts come from
the torch-free model `checks.models.ddp_buckets`, fed only the parameters' sizes, the settings and the
gradient-ready order our own hooks saw; the numbers the guide states come from its expect blocks (a row per
iteration, per gradient, per broadcast); expected gradients from the ranks' local gradients (an unwrapped
replica's, gathered) and fp32 or fp16 arithmetic.

Modules:

- `ddp_runs`: the workloads under DDP, the settings the model reads, iterations recorded, the reducer's buckets.
- `buckets`: every iteration's buckets against the model, their elements against the guide's blocks.
- `rebuild`: the second forward's rebuild, in gradient-ready order, after two broadcasts, rank 0's layout.
- `issue_order`: each bucket's all-reduce issued when its last gradient is ready; the first and last ready.
- `no_sync`: no all-reduce inside ``no_sync``; the synced micro-step's mean of the accumulated gradients.
- `bucket_view`: ``gradient_as_bucket_view``: gradients view their buckets, one copy of the bytes fewer.
- `comm_hooks`: ``allreduce_hook`` is the built-in, ``fp16_compress_hook`` within its error bound.
- `replicas`: every rank's parameters bitwise rank 0's after every step.
- `recipes`: the break-it recipes and `EXERCISES`.
"""
