"""The flat-parameter model: worked examples from guides 03 and 05, and properties over random layouts."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checks.models.flat_param import ALIGNMENT_BYTES, aligned_numel, layout, padded_numel

numels = st.lists(st.integers(0, 300), max_size=12)
element_bytes = st.sampled_from([1, 2, 4, 8, 16])
world_sizes = st.integers(1, 8)


def test_fp32_alignment_pads_before_a_misaligned_parameter() -> None:
    # 21 elements end mid-boundary; the next parameter starts at 24 (16 bytes = 4 fp32 elements).
    flat = layout([21, 7, 3], element_bytes=4, world_size=2)
    assert flat.starts == (0, 24, 32) and flat.unpadded_numel == 35 and flat.padded_numel == 36


def test_bf16_aligns_to_eight_elements() -> None:
    assert layout([21, 7], element_bytes=2, world_size=1).starts == (0, 24)
    assert layout([17, 7], element_bytes=2, world_size=1).starts == (0, 24)
    assert layout([17, 7], element_bytes=4, world_size=1).starts == (0, 20)


def test_without_alignment_parameters_are_packed() -> None:
    assert layout([21, 7, 3], element_bytes=4, world_size=4, align=False).starts == (0, 21, 28)
    assert padded_numel([21, 7, 3], 4, 4, align=False) == 32


def test_no_shard_keeps_the_unpadded_whole() -> None:
    flat = layout([21, 7, 3], element_bytes=4, world_size=4, sharded=False)
    assert flat.padded_numel == flat.unpadded_numel == 35 and flat.shard_numel == 35


def test_shards_of_the_toy_root_at_4_split_a_parameter() -> None:
    # Linear(5, 5): weight 25, bias 5 -> 25 + pad 3 + 5 = 33, padded to 36: shards of 9 elements.
    flat = layout([25, 5], element_bytes=4, world_size=4)
    assert [flat.in_shard(r) for r in range(4)] == [(9, 0), (9, 0), (7, 0), (0, 5)]


@pytest.mark.parametrize("bad", [0, 3, 32])
def test_an_element_size_that_does_not_divide_the_alignment_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="alignment"):
        layout([4], bad, 1)


@given(numels, element_bytes, world_sizes)
def test_parameters_are_ordered_aligned_and_disjoint(sizes: list[int], width: int, n: int) -> None:
    flat = layout(sizes, width, n)
    step = ALIGNMENT_BYTES // width
    ends = [s + k for s, k in zip(flat.starts, flat.numels, strict=True)]
    assert all(s % step == 0 for s in flat.starts)
    assert all(end <= start for end, start in zip(ends, flat.starts[1:], strict=False))
    # Alignment padding is always less than one boundary.
    assert all(start - end < step for end, start in zip(ends, flat.starts[1:], strict=False))
    assert flat.unpadded_numel == (ends[-1] if ends else 0)


@given(numels, element_bytes, world_sizes)
def test_shards_are_equal_and_cover_every_element_once(sizes: list[int], width: int, n: int) -> None:
    flat = layout(sizes, width, n)
    assert flat.padded_numel % n == 0 and 0 <= flat.padded_numel - flat.unpadded_numel < n
    per_param = [sum(flat.in_shard(r)[i] for r in range(n)) for i in range(len(sizes))]
    assert per_param == list(sizes)
    ranges = [flat.shard_range(r) for r in range(n)]
    assert ranges[0][0] == 0 and ranges[-1][1] == flat.padded_numel
    assert all(a[1] == b[0] for a, b in pairwise(ranges))


@given(numels, element_bytes, world_sizes)
def test_helpers_agree_with_the_layout(sizes: list[int], width: int, n: int) -> None:
    assert aligned_numel(sizes, width) == layout(sizes, width, 1).unpadded_numel
    assert padded_numel(sizes, width, n) == layout(sizes, width, n).padded_numel
    assert aligned_numel(sizes, width, align=False) == sum(sizes)
