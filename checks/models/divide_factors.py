"""How FSDP1 and FSDP2 split the mean over ranks into a divide before and a divide after the gradient reduction.

The rule guide 08 reads in ``DefaultState._get_gradient_predivide_factor``: start at f = 1 and double f while f
divides N and N / f > f. Dividing by that f before the reduce-scatter and by N / f after it keeps the summed
values small (fp16 overflows less) while the product is N: the gradient is a mean. The pre-factor is a power of
two, but it need not divide N (N = 6 gives 4 and 1.5).

FSDP2 (guide 18, ``_get_gradient_divide_factors``) uses the same doubling rule, but only where it fears overflow:
a reduce dtype other than fp32 and bf16 (fp16), or ``set_force_sum_reduction_for_comms(True)`` (then the whole N
is divided after the reduction, nothing before). For fp32 and bf16 it divides nowhere and asks the collective for
``AVG`` (``SUM`` when the data-parallel size is 1). `fsdp2_factors` states it without a custom divide factor and
without MTIA (which forces sums); ops are returned by name.
"""

from __future__ import annotations

NO_OVERFLOW_RISK = ("float32", "bfloat16")


def predivide(world_size: int) -> float:
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    factor = 1
    while world_size % factor == 0 and world_size / factor > factor:
        factor *= 2
    return float(factor)


def postdivide(world_size: int) -> float:
    return world_size / predivide(world_size)


def fsdp2_factors(
    reduce_dtype: str, world_size: int, *, force_sum: bool = False, replicas: int = 1
) -> tuple[float | None, float | None, str, str]:
    """(pre-divide, post-divide, reduce-scatter op, all-reduce op) FSDP2 uses for a gradient reduced in
    ``reduce_dtype`` (``"float32"``, ``"bfloat16"``, ``"float16"``) over ``world_size`` shard ranks times
    ``replicas`` (HSDP); None means no division."""
    size = world_size * replicas
    overflow_risk = reduce_dtype not in NO_OVERFLOW_RISK
    if not overflow_risk and not force_sum:
        op = "SUM" if size == 1 else "AVG"
        return None, None, op, op
    if overflow_risk:
        pre = predivide(size)
        return pre, size / pre, "SUM", "SUM"
    return None, float(size), "SUM", "SUM"
