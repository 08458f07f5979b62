"""FSDP2's per-parameter sharding: each parameter is split on dim 0 into N chunks of ceil(d0/N) rows.

A rank's own rows follow ``torch.chunk`` (the last ranks may get fewer rows, or none); the buffer each rank
contributes to the all-gather is padded to the full chunk.
"""

from __future__ import annotations

from math import ceil, prod


def padded_shard_numel(shape: tuple[int, ...], world_size: int) -> int:
    """Elements of one rank's padded chunk: ceil(d0/N) rows."""
    return ceil(shape[0] / world_size) * prod(shape[1:]) if shape else 0


def local_numel(shape: tuple[int, ...], world_size: int, rank: int) -> int:
    """Elements of the rank's own (unpadded) rows."""
    if not shape:
        return 0
    rows = ceil(shape[0] / world_size)
    return max(0, min(rows, shape[0] - rank * rows)) * prod(shape[1:])
