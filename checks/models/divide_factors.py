"""How FSDP1 splits the mean over ranks into a divide before and a divide after the gradient reduction.

The rule guide 08 reads in ``DefaultState._get_gradient_predivide_factor``: start at f = 1 and double f while f
divides N and N / f > f. Dividing by that f before the reduce-scatter and by N / f after it keeps the summed
values small (fp16 overflows less) while the product is N: the gradient is a mean. The pre-factor is a power of
two, but it need not divide N (N = 6 gives 4 and 1.5).
"""

from __future__ import annotations


def predivide(world_size: int) -> float:
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    factor = 1
    while world_size % factor == 0 and world_size / factor > factor:
        factor *= 2
    return float(factor)


def postdivide(world_size: int) -> float:
    return world_size / predivide(world_size)
