"""Checks for guide 08, post-backward and reduce-scatter: what each rank's sharded gradient is, numerically.

The expected gradients never come from FSDP: a DDP replica of the same model (same seed, same per-rank batches)
gives the mean gradient, and the flat-parameter model (`checks.models.flat_param`) says where each parameter's
gradient sits in the unit's padded flat gradient and which slice is this rank's. Which reduce-scatters run, in
which order and of which sizes, comes from the prefetch model's backward order (`checks.models.prefetch`) and
the same layout; the divide factors from `checks.models.divide_factors`.

Modules:

- `reductions`: what one unit's ``_reduce_grad`` did to the data (the tensors it passed through), observed.
- `reduce_scatters`: one reduce-scatter per unit, in post-backward order, padded to N, from the post-backward.
- `gradients`: the sharded gradient is DDP's slice; the divide factors; accumulation; reduce and stored dtypes.
- `clipping`: ``clip_grad_norm_`` over sharded gradients (FSDP1 and FSDP2) against DDP's, and its clamp.
- `recipes`: the break-it recipes and `EXERCISES`.
"""
