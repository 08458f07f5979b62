"""Bytes each rank sends in a ring collective over a payload of S bytes on N ranks.

All-reduce is a reduce-scatter then an all-gather: 2(N−1)/N·S. All-gather, reduce-scatter and broadcast (as a
pipelined ring) are each (N−1)/N·S.
"""

from __future__ import annotations

from fractions import Fraction

STEPS = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1, "broadcast": 1}


def ring_bytes(op: str, nbytes: int, world_size: int) -> Fraction:
    """Bytes sent per rank (exact: a fraction when N does not divide S)."""
    if op not in STEPS:
        raise ValueError(f"no ring model for {op!r}; one of {', '.join(STEPS)}")
    return Fraction(STEPS[op] * (world_size - 1) * nbytes, world_size)
