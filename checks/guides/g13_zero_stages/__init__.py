"""Checks for guide 13, ZeRO-1/2/3 side by side: the reference ZeRO (`checks.zero`), torch's
ZeroRedundancyOptimizer, FSDP1's three strategies, FSDP2 and DDP, by memory and by numbers.

Expected values come from outside the implementations: bytes per category from the torch-free model
`checks.models.zero_memory` over the model's parameter shapes; peak differences from the flat-parameter layout
model; numerics from DDP, each reduced gradient from the ranks' local gradients (an unwrapped replica's, gathered),
and the tolerances from the guide's own prose.

- `memory`: bytes by category after one step, per implementation and per optimizer.
- `numerics`: every implementation against DDP (bitwise at N=2, a summation order at N=4).
- `peaks`: SHARD_GRAD_OP's unsharded peak against FULL_SHARD's.
- `logits`: DDP against one process on the global batch.
- `pass_through`: the reference ZeRO-3 on blocks that return one of their inputs.
- `recipes`: the break-it recipes the tests apply.
"""
