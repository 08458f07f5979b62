"""Checks for guide 11, the final callback and HYBRID_SHARD: what the end of backward resets and reshards, and
how HYBRID_SHARD reduces over two groups (or, with one-rank shard groups, fails to).

Expected values never come from the state being checked: the reset values are the guide's expect block `resets`
(the values the source assigns) and what the catch-all frees its block `catch-all`, orders come from the model's
structure (guide 06's post-forward order), shard sizes from the flat-parameter layout model, and reference
gradients and parameters from DDP on the same per-rank batches, laid out by `checks.workloads.gpt.grad_shards`.

Modules:

- `observing`: the torch functions observed (and bent) by symbol, and the observer.
- `final_callback`: every unit IDLE after backward; next_iter clears the post-forward order; finalizing the grad.
- `catch_all`: the catch-all model and what the final callback's catch-all frees per backward-prefetch mode.
- `hybrid_shard`: HYBRID_SHARD with the default groups against DDP, and over a 2 x 2 mesh.
- `recipes`: the break-it recipes.
"""
