"""FSDP2's per-parameter sharding: each parameter is split on dim 0 into N chunks of ceil(d0/N) rows.

Written from guide 16's reading of ``FSDPParam._init_sharded_param`` and ``_chunk_with_empty``, without torch:

1. Chunk size. A parameter of shape ``(d0, *rest)`` on N ranks is cut into chunks of ``c = ceil(d0/N)`` rows
   (``torch.chunk``'s rule). Rank r's own rows are ``min(c, d0 - r*c)``, never below 0: the last ranks may get
   fewer rows, or none (9 rows on 4 ranks: 3, 3, 3, 0; 6 rows on 4 ranks: 2, 2, 2, 0, not 2, 2, 1, 1).
2. The local tensor (the DTensor's ``_local_tensor``) is those rows, unpadded, shape ``(rows, *rest)``. One
   exception: a chunk with no elements is given ``rows = 0`` (``_get_dim_chunked_size``), so a ``(9, 0)``
   parameter is ``(0, 0)`` on every rank, where ``torch.chunk`` would give ``(3, 0)``.
3. The padded buffer (``_sharded_param_data``) is 1-D, ``c * prod(rest)`` elements on every rank: the rank's rows
   first, then zeros. It is what the rank contributes to the all-gather; the local tensor is a view of its start.
4. The all-gather: each rank's input is its parameters' padded buffers, concatenated in parameter order; the
   output is N such inputs, rank by rank. Each parameter's all-gather output is ``N * c`` rows, and the unsharded
   parameter is its first ``d0`` rows.
5. Memory: a rank holds the padded buffers of its parameters and nothing else between all-gathers:
   ``sum(c * prod(rest) * itemsize)`` bytes, padding included.
"""

from __future__ import annotations

from collections.abc import Iterable
from math import ceil, prod

Shape = tuple[int, ...]


def chunk_rows(d0: int, world_size: int) -> int:
    """Rule 1: the rows of one chunk, ``ceil(d0/N)``."""
    return ceil(d0 / world_size)


def local_rows(shape: Shape, world_size: int, rank: int) -> int:
    """Rules 1 and 2: the rows of the rank's local tensor (0 when its chunk holds no elements)."""
    if not shape:
        return 0
    rows = chunk_rows(shape[0], world_size)
    own = max(0, min(rows, shape[0] - rank * rows))
    return own if own * prod(shape[1:]) > 0 else 0


def local_shape(shape: Shape, world_size: int, rank: int) -> Shape:
    """Rule 2: the shape of the rank's local tensor."""
    return (local_rows(shape, world_size, rank), *shape[1:])


def padded_shape(shape: Shape, world_size: int) -> Shape:
    """Rule 3: the shape the padded buffer has before it is flattened (``padded_sharded_param_size``)."""
    return (chunk_rows(shape[0], world_size), *shape[1:])


def padded_shard_numel(shape: Shape, world_size: int) -> int:
    """Elements of one rank's padded chunk: ceil(d0/N) rows."""
    return ceil(shape[0] / world_size) * prod(shape[1:]) if shape else 0


def local_numel(shape: Shape, world_size: int, rank: int) -> int:
    """Elements of the rank's own (unpadded) rows."""
    if not shape:
        return 0
    rows = ceil(shape[0] / world_size)
    return max(0, min(rows, shape[0] - rank * rows)) * prod(shape[1:])


def row_range(shape: Shape, world_size: int, rank: int) -> tuple[int, int]:
    """The rows ``[start, stop)`` of the unsharded parameter the rank holds (empty when it holds none)."""
    rows = chunk_rows(shape[0], world_size)
    start = min(rank * rows, shape[0])
    return start, start + local_rows(shape, world_size, rank)


def gathered_shape(shape: Shape, world_size: int) -> Shape:
    """Rule 4: the shape of a parameter's all-gather output, ``N * ceil(d0/N)`` rows, padding included."""
    return (world_size * chunk_rows(shape[0], world_size), *shape[1:])


def all_gather_input_numels(shapes: Iterable[Shape], world_size: int) -> list[int]:
    """Rule 4: the split sizes of one rank's all-gather input, one padded chunk per parameter."""
    return [padded_shard_numel(shape, world_size) for shape in shapes]


def shard_bytes(params: Iterable[tuple[Shape, int]], world_size: int) -> int:
    """Rule 5: bytes a rank holds for ``(shape, itemsize)`` parameters between all-gathers, padding included."""
    return sum(padded_shard_numel(shape, world_size) * itemsize for shape, itemsize in params)


def local_bytes(params: Iterable[tuple[Shape, int]], world_size: int, rank: int) -> int:
    """Bytes of the rank's own rows, without padding (what an unpadded shard would need)."""
    return sum(local_numel(shape, world_size, rank) * itemsize for shape, itemsize in params)
