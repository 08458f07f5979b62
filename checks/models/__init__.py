"""Torch-free models: the independent oracles claims compare what torch did against.

Each module states one rule the guides read in torch's source, as a pure function of plain numbers and names,
written from the guide's reading, never by calling torch's helpers. Nothing here imports torch (a test enforces
it), so each model is unit-tested and property-tested in milliseconds.

- `flat_param`: FSDP1's flat-parameter layout: alignment padding, world-size padding, each rank's shard.
- `fsdp2_shards`: FSDP2's per-parameter dim-0 chunks and their padding.
- `prefetch`: which unit FSDP1 unshards ahead of time, forward (the recorded order) and backward (the
  reverse post-forward order), and the event sequence of one step around it.
- `rate_limiter`: the all-gather rate limiter's queue of free events.
- `zero_partition`: ZeroRedundancyOptimizer's greedy partition of parameters across ranks.
- `ring`: bytes each rank sends in ring collectives.
- `divide_factors`: how FSDP1 and FSDP2 split the mean over N ranks into a divide before and after the reduction.
- `fsdp2_precision`: the dtype of each stage of an FSDP2 step under a `MixedPrecisionPolicy`.
- `fsdp2_reshard`: where FSDP2 reshards each unit after forward, and the all-gathers and bytes that costs.
"""
