"""ZeroRedundancyOptimizer's partition of parameters across ranks, as its greedy rule states it.

Parameters are sorted by size, largest first (stable on ties), and each goes to the rank that holds the fewest
elements so far (the lowest rank on ties). Optimizer state follows the partition, so its imbalance is this one.
"""

from __future__ import annotations

from collections.abc import Sequence


def greedy_partition(params: Sequence[tuple[str, int]], world_size: int) -> list[list[tuple[str, int]]]:
    """``params`` as (name, numel); each rank's (name, numel) in the order they were assigned."""
    ranks: list[list[tuple[str, int]]] = [[] for _ in range(world_size)]
    sizes = [0] * world_size
    for name, numel in sorted(params, key=lambda p: p[1], reverse=True):
        rank = sizes.index(min(sizes))
        ranks[rank].append((name, numel))
        sizes[rank] += numel
    return ranks
