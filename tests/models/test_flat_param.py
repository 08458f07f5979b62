"""`layout`, the numel-only view of the flat-parameter spec the guides use: worked examples from guides 03 and 05,
and properties over random layouts (the spec itself: test_flat_param_spec.py)."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checks.models.flat_param import ALIGNMENT_BYTES, aligned_numel, layout, padded_numel

FAST = settings(max_examples=60, deadline=None, database=None)
numels = st.lists(st.integers(0, 300), min_size=1, max_size=12).filter(any)  # FSDP builds nothing from no elements
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


def test_no_shard_keeps_the_whole_flat_parameter() -> None:
    # Packed: 21 + 7 + 3 = 31, and use_orig_params=False adds no padding without sharding.
    flat = layout([21, 7, 3], element_bytes=4, world_size=4, align=False, sharded=False)
    assert flat.padded_numel == flat.unpadded_numel == 31 and flat.shard_numel == 31
    # use_orig_params=True pads to the world size inside the flat parameter, NO_SHARD too: 35 -> 36 (measured).
    flat = layout([21, 7, 3], element_bytes=4, world_size=4, sharded=False)
    assert (flat.unpadded_numel, flat.padded_numel, flat.shard_numel) == (35, 36, 36)
    assert all(flat.shard_range(r) == (0, 36) for r in range(4))


@pytest.mark.parametrize("sizes", [[], [0], [0, 0]])
def test_a_unit_without_elements_is_refused(sizes: list[int]) -> None:
    with pytest.raises(ValueError, match=r"zero-size|at least one"):
        layout(sizes, 4, 2)


def test_shards_of_the_toy_root_at_4_split_a_parameter() -> None:
    # Linear(5, 5): weight 25, bias 5 -> 25 + pad 3 + 5 = 33, padded to 36: shards of 9 elements.
    flat = layout([25, 5], element_bytes=4, world_size=4)
    assert [flat.in_shard(r) for r in range(4)] == [(9, 0), (9, 0), (7, 0), (0, 5)]


@pytest.mark.parametrize("bad", [0, 3, 32])
def test_an_element_size_that_does_not_divide_the_alignment_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="alignment"):
        layout([4], bad, 1)


@FAST
@given(numels, element_bytes, world_sizes)
def test_parameters_are_ordered_aligned_and_disjoint(sizes: list[int], width: int, n: int) -> None:
    flat = layout(sizes, width, n)
    step = ALIGNMENT_BYTES // width
    ends = [s + k for s, k in zip(flat.starts, flat.numels, strict=True)]
    assert all(s % step == 0 for s in flat.starts)
    assert all(end <= start for end, start in zip(ends, flat.starts[1:], strict=False))
    # Alignment padding is always less than one boundary.
    assert all(start - end < step for end, start in zip(ends, flat.starts[1:], strict=False))
    assert flat.unpadded_numel == ends[-1]


@FAST
@given(numels, element_bytes, world_sizes)
def test_shards_are_equal_and_cover_every_element_once(sizes: list[int], width: int, n: int) -> None:
    flat = layout(sizes, width, n)
    assert flat.padded_numel % n == 0 and 0 <= flat.padded_numel - flat.unpadded_numel < n
    per_param = [sum(flat.in_shard(r)[i] for r in range(n)) for i in range(len(sizes))]
    assert per_param == list(sizes)
    ranges = [flat.shard_range(r) for r in range(n)]
    assert ranges[0][0] == 0 and ranges[-1][1] == flat.padded_numel
    assert all(a[1] == b[0] for a, b in pairwise(ranges))


@FAST
@given(numels, element_bytes, world_sizes)
def test_helpers_agree_with_the_layout(sizes: list[int], width: int, n: int) -> None:
    assert aligned_numel(sizes, width) == layout(sizes, width, 1).unpadded_numel
    assert padded_numel(sizes, width, n) == layout(sizes, width, n).padded_numel
    assert aligned_numel(sizes, width, align=False) == sum(sizes)
