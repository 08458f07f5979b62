"""Checks for guide 16, FSDP2's per-parameter sharding: every parameter a ``Shard(0)`` DTensor whose local tensor
is its unpadded ``torch.chunk`` rows, the padded ``_sharded_param_data`` behind it, the all-gather's copy-in and
copy-out, the bytes a rank holds, and torch 2.15's option to keep the unsharded storage across a reshard.

The property checks take one drawn model (`checks.models.fsdp2_draws`, plain data drawn in the pytest process)
and build it identically on every rank (`checks.workloads.drawn_fsdp2`). Expected values never come from FSDP:
shapes, sizes and bytes from the spec (`checks.models.fsdp2_shards`), values from an unwrapped replica built from
the same seed, sliced at the spec's rows; the fixed model's rows are the guide's `expect nine-rows-on-four` block.
Every comparison is exact (``torch.equal``, or byte for byte where the all-gather runs in bytes).

Modules:

- `fsdp_params`: the drawn model under ``fully_shard``, its groups, each parameter's ``FSDPParam``, storages.
- `replica_rows`: a rank's expected rows and padded chunk from the replica and the spec; the bytewise compare.
- `shards`: the DTensor shards and the padded buffer (shards-are-the-spec-at-2, -at-4).
- `all_gather`: copy-in, the collective, copy-out, the unsharded parameter, the reshard (all-gather-reconstructs).
- `memory`: the bytes a rank holds, the spec's shard bytes (memory-is-shard-bytes-at-2, -at-4).
- `nine_rows`: the guide's fixed model on four ranks, row for row its expect block (nine-rows-on-four).
- `keep_storage`: ``set_keep_unsharded_storage`` from torch 2.15, and the releases before it that ignore it.
- `recipes`: the break-it recipes.
"""
