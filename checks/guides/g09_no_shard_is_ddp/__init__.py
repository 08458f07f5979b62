"""Checks for guide 09, NO_SHARD is DDP: what FSDP1 communicates when it does not shard, and whether training then
matches DistributedDataParallel bit for bit.

Every expected value comes from outside FSDP: flat-parameter and all-reduce sizes from the flat-parameter layout
model (`checks.models.flat_param`, NO_SHARD's world-size padding included) over the model's own parameter sizes,
divide factors from the divide-factor model (`checks.models.divide_factors`), local gradients from an unwrapped
replica of the same model on the same batch, and the reference training run from DDP.
The warnings are compared with the text the guide quotes in its expect blocks (`deprecation`, `clamp`).

Modules:

- `replicas`: the NO_SHARD model, its unwrapped replica, and the ratios of one gradient to another.
- `all_reduces`: one all-reduce per unit, in backward only, predivided; NO_SHARD still pads for the world size.
- `against_ddp`: NO_SHARD trained beside DDP, bitwise on two ranks and within a bound on four.
- `choice`: the deprecation warning, the one-rank clamp, and a HYBRID_SHARD of one-rank shard groups.
- `recipes`: the break-it recipes.
"""
