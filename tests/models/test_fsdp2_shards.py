"""FSDP2's dim-0 chunks (guide 16): ``torch.chunk``'s rule without torch, the local shapes, the padded all-gather
buffer, the all-gather's sizes and the bytes a rank holds."""

from __future__ import annotations

from itertools import pairwise
from math import ceil, prod

from hypothesis import given
from hypothesis import strategies as st

from checks.models.fsdp2_shards import (
    all_gather_input_numels,
    gathered_shape,
    local_bytes,
    local_numel,
    local_rows,
    local_shape,
    padded_shape,
    padded_shard_numel,
    row_range,
    shard_bytes,
)


def test_nine_rows_on_four_ranks_give_three_three_three_none() -> None:
    assert [local_numel((9,), 4, r) for r in range(4)] == [3, 3, 3, 0]
    assert padded_shard_numel((9,), 4) == 3


def test_fewer_rows_than_ranks() -> None:
    assert [local_numel((2, 5), 4, r) for r in range(4)] == [5, 5, 0, 0]
    assert padded_shard_numel((2, 5), 4) == 5


@given(st.lists(st.integers(0, 20), min_size=1, max_size=3).map(tuple), st.integers(1, 8))
def test_local_chunks_cover_the_parameter_and_fit_the_padded_buffer(shape: tuple[int, ...], n: int) -> None:
    local = [local_numel(shape, n, r) for r in range(n)]
    assert sum(local) == prod(shape)
    assert all(k <= padded_shard_numel(shape, n) for k in local)
    assert padded_shard_numel(shape, n) * n == ceil(shape[0] / n) * n * prod(shape[1:])
    # Chunks are never larger on a later rank (torch.chunk fills ranks in order).
    assert local == sorted(local, reverse=True)


# -- the spec's rules (guide 16) ------------------------------------------------------------------------------------
def test_six_rows_on_four_ranks_leave_the_last_rank_empty() -> None:
    # torch.chunk's rule: chunks of ceil(6/4) = 2 rows, so 2, 2, 2, 0 (not tensor_split's 2, 2, 1, 1).
    assert [local_rows((6,), 4, r) for r in range(4)] == [2, 2, 2, 0]


def test_a_chunk_without_elements_has_no_rows() -> None:
    # (9, 0): torch.chunk's pieces are (3, 0), but `_get_dim_chunked_size` makes every local tensor (0, 0).
    assert [local_shape((9, 0), 4, r) for r in range(4)] == [(0, 0)] * 4
    assert padded_shape((9, 0), 4) == (3, 0) and padded_shard_numel((9, 0), 4) == 0
    assert [local_shape((0, 4), 4, r) for r in range(4)] == [(0, 4)] * 4


def test_the_guide_s_model_on_four_ranks() -> None:
    params = [((9, 2), 4), ((3,), 4), ((0, 4), 4), ((9, 0), 4)]
    assert shard_bytes(params, 4) == 28
    assert [local_bytes(params, 4, r) for r in range(4)] == [28, 28, 28, 0]
    assert [local_shape((9, 2), 4, r) for r in range(4)] == [(3, 2), (3, 2), (3, 2), (0, 2)]
    assert [row_range((9, 2), 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 9)]
    assert all_gather_input_numels([s for s, _ in params], 4) == [6, 1, 0, 0]
    assert gathered_shape((9, 2), 4) == (12, 2)


@given(st.lists(st.integers(0, 20), min_size=1, max_size=3).map(tuple), st.integers(1, 8))
def test_rows_tile_dim_0_in_order(shape: tuple[int, ...], n: int) -> None:
    ranges = [row_range(shape, n, r) for r in range(n)]
    if prod(shape):
        # Contiguous, in rank order, covering every row exactly once.
        assert ranges[0][0] == 0 and ranges[-1][1] == shape[0]
        assert all(a[1] == b[0] for a, b in pairwise(ranges))
    assert all(local_shape(shape, n, r)[1:] == shape[1:] for r in range(n))
    assert all(local_rows(shape, n, r) <= padded_shape(shape, n)[0] for r in range(n))
    assert gathered_shape(shape, n)[0] >= shape[0] and gathered_shape(shape, n)[0] - shape[0] < n
