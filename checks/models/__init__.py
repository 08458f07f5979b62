"""Torch-free models: the independent oracles claims compare what torch did against.

Each module states one rule the guides read in torch's source, as a pure function of plain numbers and names,
written from the guide's reading, never by calling torch's helpers. Nothing here imports torch (a test enforces
it), so each model is unit-tested and property-tested in milliseconds.

Layouts and shards:
- `flat_param`: FSDP1's flat-parameter layout: alignment padding, world-size padding, each rank's shard;
  `flat_param_diagram` draws it in text; `flat_param_draws` draws random units for guide 12's properties.
- `fsdp2_shards`: FSDP2's per-parameter dim-0 chunks and their padding; `fsdp2_draws`: random models (guide 16).
- `zero_partition`: ZeroRedundancyOptimizer's greedy partition of parameters across ranks.
- `tensor_parallel`: which parameters each of N ranks holds when Megatron splits a block (guide 21).

Order and timing:
- `prefetch`: which unit FSDP1 unshards ahead of time, forward (the recorded order) and backward (the reverse
  post-forward order), and the event sequence of one step around it.
- `autograd_order`: in which order autograd reaches FSDP1's backward hooks when forward prefetch runs (guide 04).
- `fsdp2_step_map`: which hooks one FSDP2 step runs and which FSDP calls each makes (guide 22).
- `fsdp2_prefetch`: which FSDP2 group unshards ahead of time (guide 17).
- `fsdp2_reshard`: where FSDP2 reshards each unit after forward, and the all-gathers and bytes that costs.
- `rate_limiter`: the all-gather rate limiter's queue of free events.
- `ddp_buckets`: DDP's gradient buckets in each iteration, and the all-reduces a step issues (guide 19).
- `pipeline`: pipeline schedules as slots, their bubble and their point-to-point traffic (guide 21).
- `wrap`: FSDP1's auto wrap as a function of a module tree and a policy (guide 20).

Numbers:
- `divide_factors`: how FSDP1 and FSDP2 split the mean over N ranks into a divide before and after the reduction.
- `fsdp2_precision`: the dtype of each stage of an FSDP2 step under a `MixedPrecisionPolicy`.
- `unit_counts`: how many units' unsharded buffers add up to a measured number of bytes (guides 04, 06).
- `zero_memory`: per-rank bytes by category for every data-parallel implementation (guide 13).
- `comm_volume`: bytes one step communicates per strategy, from the parameter sizes alone (guide 15).
- `ring`: bytes each rank sends in ring collectives; `ring_draws`: random inputs for guide 14's properties.
- `cost`: what a job costs before it runs (``fsdp-readings estimate``); `recommend`: seed 001's recipe as a
  function (``--recommend``); `seed_figures`: the seeds' numbers recomputed by the cost model.

May import: nothing else of checks.
"""
