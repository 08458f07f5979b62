"""ZeroRedundancyOptimizer's greedy partition."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from checks.models.zero_partition import greedy_partition


def test_the_toy_at_two_ranks() -> None:
    toy = [("0.weight", 21), ("0.bias", 7), ("1.weight", 35), ("1.bias", 5), ("2.weight", 25), ("2.bias", 5)]
    ranks = greedy_partition(toy, 2)
    assert ranks == [
        [("1.weight", 35), ("0.bias", 7), ("1.bias", 5)],  # 35, 42, then 47 (rank 1 holds 46)
        [("2.weight", 25), ("0.weight", 21), ("2.bias", 5)],  # 25, 46, then 51 (rank 0 holds 47)
    ]


@given(st.lists(st.integers(0, 1000), max_size=20), st.integers(1, 8))
def test_every_parameter_once_and_imbalance_below_the_largest(sizes: list[int], n: int) -> None:
    params = [(f"p{i}", k) for i, k in enumerate(sizes)]
    ranks = greedy_partition(params, n)
    assert sorted(p for r in ranks for p in r) == sorted(params)
    loads = [sum(k for _, k in r) for r in ranks]
    # Greedy list scheduling: no rank exceeds another by more than the largest parameter.
    assert max(loads) - min(loads) <= max(sizes, default=0)
