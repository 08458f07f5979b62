"""The DDP bucket model: hand-worked layouts, then agreement with torch's own binding
(``dist._compute_bucket_assignment_by_size``, C++, needs no process group) and with ``_BucketCapacityConfig`` on every
case drawn. The torch side only checks the model; the model never imports torch (`test_torch_free.py`)."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.parallel.distributed import _BucketCapacityConfig

from checks.models import ddp_buckets as db

SIX_LINEAR = [db.Param(n) for n in [65536, 256] * 6]  # six Linear(256, 256): weight, bias, ...
READY = list(range(11, -1, -1))  # their gradients become ready from the last bias back to the first weight
DTYPES = {"float32": torch.float32, "float16": torch.float16, "float64": torch.float64}
SIZES = {"float32": 4, "float16": 2, "float64": 8}


def binding(params: list[db.Param], limits: list[int], order: list[int] | None = None) -> list[list[int]]:
    """torch's assignment of the same parameters: tensors listed in the walk order, as the reducer's rebuild does."""
    tensors = [torch.empty(p.numel, dtype=DTYPES[p.dtype], device="meta") for p in params]
    if order is None:
        indices, _ = dist._compute_bucket_assignment_by_size(tensors, limits)
    else:
        indices, _ = dist._compute_bucket_assignment_by_size([tensors[i] for i in order], limits, [], order)
    return [list(bucket) for bucket in indices]


# -- capacities and limits ---------------------------------------------------------------------------------------
def test_the_first_bucket_default_is_torchs() -> None:
    assert db.DEFAULT_FIRST_BUCKET_BYTES == dist._DEFAULT_FIRST_BUCKET_BYTES == 1024 * 1024
    assert sys.maxsize == db.MAXSIZE


@pytest.mark.parametrize(
    ("cap_mb", "cap_list", "expected"),
    [
        (None, None, db.Capacity(25 * db.MIB, (), db.MIB)),
        (25, None, db.Capacity(25 * db.MIB, (), 25 * db.MIB)),  # an explicit 25 is not the default
        (0.3, None, db.Capacity(314572, (), 314572)),  # int() truncates 0.3 MiB
        (None, [0.1, 1.0], db.Capacity(db.MIB, (104857, db.MIB), db.MIB)),
        (4, [0.5, 2], db.Capacity(2 * db.MIB, (524288, 2 * db.MIB), 2 * db.MIB)),  # the list wins over the cap
    ],
)
def test_capacity(cap_mb: float | None, cap_list: list[float] | None, expected: db.Capacity) -> None:
    assert db.capacity(cap_mb, cap_list) == expected


@pytest.mark.parametrize("cap_mb", [None, 0.3, 1, 25, 40])
@pytest.mark.parametrize("cap_list", [None, [0.1, 1.0], [2]])
@pytest.mark.parametrize(("static_graph", "find_unused"), [(False, False), (False, True), (True, False), (True, True)])
def test_capacity_and_limits_are_torchs(cap_mb, cap_list, static_graph: bool, find_unused: bool) -> None:
    config = _BucketCapacityConfig.create(bucket_cap_mb=cap_mb, bucket_cap_mb_list=cap_list, use_python_reducer=False)
    cap = db.capacity(cap_mb, cap_list)
    assert (cap.bucket_bytes, cap.per_bucket_bytes, cap.first_bucket_bytes) == (
        config.bucket_bytes_cap, config.per_bucket_bytes_caps, config.first_bucket_bytes_cap)  # fmt: skip
    limits = db.size_limits(cap, static_graph=static_graph, find_unused_parameters=find_unused)
    assert limits == config.compute_bucket_size_limits(static_graph=static_graph, find_unused_parameters=find_unused)


def test_by_default_iteration_1_has_no_limit() -> None:
    assert db.size_limits(db.capacity(), static_graph=False, find_unused_parameters=False) == ([db.MAXSIZE], [])
    assert db.size_limits(db.capacity(), static_graph=False, find_unused_parameters=True) == ([db.MIB, 25 * db.MIB], [])


# -- the assignment, by hand -------------------------------------------------------------------------------------
def test_six_linear_by_default() -> None:
    steps = db.plan(SIX_LINEAR, READY)
    assert [s.buckets for s in steps] == [[list(range(12))], [READY[:8], READY[8:]], [READY[:8], READY[8:]]]
    assert [db.bucket_numels(SIX_LINEAR, s.buckets) for s in steps] == [[394752], [263168, 131584], [263168, 131584]]
    assert [s.broadcasts for s in steps] == [[], [13, 2], []]


def test_a_bucket_closes_past_its_cap() -> None:
    # The first rebuilt bucket closes on the parameter that reaches 1 MiB: four layers, 1,052,672 bytes.
    first = db.rebuilt_buckets(SIX_LINEAR, READY)[0]
    assert sum(SIX_LINEAR[i].nbytes for i in first) == 1052672 > db.MIB
    assert sum(SIX_LINEAR[i].nbytes for i in first[:-1]) < db.MIB


def test_a_small_cap_splits_the_list_in_the_middle() -> None:
    options = db.Options(bucket_cap_mb=0.3)
    assert db.initial_buckets(SIX_LINEAR, options) == [list(range(12))]
    assert db.rebuilt_buckets(SIX_LINEAR, READY, options) == [READY[0:4], READY[4:8], READY[8:12]]


def test_find_unused_parameters_caps_from_the_start_and_never_rebuilds() -> None:
    steps = db.plan(SIX_LINEAR, READY, db.Options(find_unused_parameters=True))
    # registration order, closed at 1 MiB (seven parameters: 1,051,648 bytes), sorted, then reversed
    assert [s.buckets for s in steps] == [[[7, 8, 9, 10, 11], list(range(7))]] * 3
    assert [s.broadcasts for s in steps] == [[], [], []]
    assert steps[0].all_reduces == [(131840, "float32"), (262912, "float32"), (12, "int32")]


def test_a_cap_list_applies_from_the_start_and_to_the_rebuild() -> None:
    steps = db.plan(SIX_LINEAR, READY, db.Options(bucket_cap_mb_list=(0.1, 1.0)))
    assert steps[0].buckets == [[9, 10, 11], [1, 2, 3, 4, 5, 6, 7, 8], [0]]
    assert steps[1].buckets == [[11, 10], [9, 8, 7, 6, 5, 4, 3, 2], [1, 0]]
    assert steps[1].broadcasts == [13, 3]


def test_static_graph_rebuilds_at_the_third_forward() -> None:
    steps = db.plan(SIX_LINEAR, READY, db.Options(static_graph=True), iterations=4)
    assert [len(s.buckets) for s in steps] == [1, 1, 2, 2]
    assert [s.broadcasts for s in steps] == [[], [], [13, 2], []]
    assert steps[0].all_reduces == [(12, "int32"), (394752, "float32")]  # the used map first, then the bucket
    assert [len(s.all_reduces) for s in steps] == [2, 1, 2, 2]


def test_the_last_bucket_cap_moves_the_small_bucket_last() -> None:
    # DDP_SET_LAST_BUCKET_CAP=1: the walk starts from the last gradient to be ready (0.weight); seven parameters
    # reach 1,051,648 bytes and close the 1 MiB bucket, which the final reversal puts last.
    options = db.Options(last_bucket_cap=True)
    steps = db.plan(SIX_LINEAR, READY, options)
    assert [s.buckets for s in steps] == [[list(range(12))], [[7, 8, 9, 10, 11], list(range(7))],
                                          [[7, 8, 9, 10, 11], list(range(7))]]  # fmt: skip
    assert [db.bucket_numels(SIX_LINEAR, s.buckets) for s in steps] == [[394752], [131840, 262912], [131840, 262912]]
    assert [s.broadcasts for s in steps] == [[], [13, 2], []]
    # gradients ready in exactly the reverse of registration: find_unused_parameters' buckets, from the rebuild on
    assert steps[1].buckets == db.initial_buckets(SIX_LINEAR, db.Options(find_unused_parameters=True))
    last = steps[1].buckets[-1]
    assert sum(SIX_LINEAR[i].nbytes for i in last) == 1051648 and sum(SIX_LINEAR[i].nbytes for i in last[:-1]) < db.MIB


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        # measured on 2.13.0 with the variable set: every limit walks backwards, the list's first cap too
        (db.Options(bucket_cap_mb=0.3, last_bucket_cap=True), [[11], [7, 8, 9, 10], [3, 4, 5, 6], [0, 1, 2]]),
        (db.Options(bucket_cap_mb_list=(0.1, 1.0), last_bucket_cap=True), [[9, 10, 11], list(range(1, 9)), [0]]),
    ],
)
def test_the_last_bucket_cap_with_other_caps(options: db.Options, expected: list[list[int]]) -> None:
    assert db.rebuilt_buckets(SIX_LINEAR, READY, options) == expected


def test_the_last_bucket_cap_leaves_iteration_1_and_find_unused_alone() -> None:
    # Only the rebuild reads the variable: no rebuild, no change.
    plain = db.plan(SIX_LINEAR, READY, db.Options(find_unused_parameters=True))
    assert db.plan(SIX_LINEAR, READY, db.Options(find_unused_parameters=True, last_bucket_cap=True)) == plain
    assert db.initial_buckets(SIX_LINEAR, db.Options(last_bucket_cap=True)) == db.initial_buckets(SIX_LINEAR)


def test_each_dtype_buckets_on_its_own() -> None:
    params = [db.Param(100, 4, "float32"), db.Param(100, 2, "float16"), db.Param(100, 4, "float32")]
    assert db.assign(params, [600]) == [[0, 2], [1]]


def test_an_order_must_be_a_permutation() -> None:
    with pytest.raises(ValueError, match="permutation"):
        db.assign(SIX_LINEAR, [db.MIB], [0, 1])


def test_view_offsets_pack_the_bucket() -> None:
    assert db.view_offsets(SIX_LINEAR, [11, 10, 9]) == [0, 256, 65792]


# -- against torch's binding ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("limits", "order"),
    [([db.MAXSIZE], None), ([db.MIB, 25 * db.MIB], None), ([314572], None), ([104857, db.MIB], None),
     ([db.MIB, 25 * db.MIB], READY), ([314572], READY), ([104857, db.MIB], READY), ([1], READY), ([1], None)],
)  # fmt: skip
def test_six_linear_agrees_with_the_binding(limits: list[int], order: list[int] | None) -> None:
    assert db.assign(SIX_LINEAR, limits, order) == binding(SIX_LINEAR, limits, order)


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[db.Param], list[int], list[int] | None]:
    ordered = draw(st.booleans())
    dtypes = ["float32"] if ordered else draw(st.lists(st.sampled_from(sorted(DTYPES)), min_size=1, max_size=3))
    params = [
        db.Param(numel, SIZES[dtype], dtype)
        for numel, dtype in draw(
            st.lists(st.tuples(st.integers(1, 5000), st.sampled_from(dtypes)), min_size=1, max_size=14)
        )
    ]
    total = sum(p.nbytes for p in params)
    limits = draw(st.lists(st.integers(1, max(1, total)), min_size=1, max_size=4))  # caps inside the list's size
    order = draw(st.permutations(range(len(params)))) if ordered else None
    return params, limits, order


@settings(max_examples=300, deadline=None)
@given(cases())
def test_every_drawn_case_agrees_with_the_binding(case: tuple[list[db.Param], list[int], list[int] | None]) -> None:
    params, limits, order = case
    assert db.assign(params, limits, order) == binding(params, limits, order)


@settings(max_examples=100, deadline=None)
@given(cases())
def test_the_last_bucket_cap_is_the_binding_walked_backwards(
    case: tuple[list[db.Param], list[int], list[int] | None],
) -> None:
    # The rule against torch's assignment given the reversed ready order, then reversed: the reducer's two steps.
    params, _, order = case
    if order is None or len({p.dtype for p in params}) > 1:
        return
    options = db.Options(bucket_cap_mb=0.01, last_bucket_cap=True)
    limits = db.rebuild_limits(db.capacity(0.01), [])
    backwards = list(reversed(order))
    assert db.rebuilt_buckets(params, order, options) == list(reversed(binding(params, limits, backwards)))
