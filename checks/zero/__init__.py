"""A reference ZeRO-1/2/3, short enough to read next to FSDP (guide 13).

- `checks.zero.groups`: parameter groups, each one flat buffer padded to a multiple of N and cut into N shards;
- `checks.zero.zero1`: ZeRO-1, optimizer state sharded; whole gradients in a buffer, reduce-scattered per group;
- `checks.zero.zero2`: ZeRO-2, each group's whole gradient freed as soon as it is reduced;
- `checks.zero.zero3`: ZeRO-3, each group's whole parameters gathered for its forward and its backward only.

Use: ``engine = Zero2(model, ["blocks.0", "blocks.1", "blocks.2"])``; then ``engine.model(x)``, ``backward()``,
``engine.step()``, ``engine.zero_grad()``. The engine replaces the optimizer and DDP: do not wrap the model.

May import: nothing else of checks.
"""

from checks.zero.groups import FlatGroup, module_groups, shard_range
from checks.zero.zero1 import Zero1, adamw
from checks.zero.zero2 import Zero2
from checks.zero.zero3 import Zero3

STAGES = {1: Zero1, 2: Zero2, 3: Zero3}

__all__ = ["STAGES", "FlatGroup", "Zero1", "Zero2", "Zero3", "adamw", "module_groups", "shard_range"]
