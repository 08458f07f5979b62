"""FSDP2's dim-0 chunks: ``torch.chunk``'s rule without torch, and the padded all-gather buffer."""

from __future__ import annotations

from math import ceil, prod

from hypothesis import given
from hypothesis import strategies as st

from checks.models.fsdp2_shards import local_numel, padded_shard_numel


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
