"""Checks for guide 10, `no_sync` and frozen units: what backward keeps, frees and reduces when gradients are not
synchronised, and when a unit whose parameters need no gradient is resharded.

Expected values never come from FSDP: sizes from the flat-parameter model (`checks.models.flat_param`), hook
orders from the backward rule model (`checks.models.prefetch`) or the guide's `expect` blocks, each step's
collectives from `checks.models.comm_volume` (counted in the guide's `no-sync-steps`), and the gradients of an
accumulated batch from an unwrapped replica of the model run in this process on the whole batch.

Modules:

- `recording`: one step's collectives and events, the backward's order read from them, the bytes units hold.
- `layouts`: the flat parameters of mini_gpt tiny's units and the toy's, by the flat-parameter model.
- `no_sync_grads`: the unsharded gradient kept inside ``no_sync``, its length and views, and accumulation.
- `no_sync_backward`: what FULL_SHARD and SHARD_GRAD_OP free, keep and communicate around a ``no_sync`` step.
- `micro_batches`: each step's collectives over a run of micro-batches, per strategy.
- `frozen`: frozen units' reshard (reshard-only hook, catch-all) and a frozen parameter in a trainable unit.
- `recipes`: the break-it recipes.
"""
