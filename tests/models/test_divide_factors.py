"""The pre- and post-divide factors of FSDP1's gradient reduction."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checks.models.divide_factors import fsdp2_factors, postdivide, predivide


@pytest.mark.parametrize(
    ("n", "pre", "post"), [(1, 1, 1), (2, 2, 1), (4, 2, 2), (6, 4, 1.5), (8, 4, 2), (16, 4, 4), (64, 8, 8)]
)
def test_worked_values(n: int, pre: float, post: float) -> None:
    assert (predivide(n), postdivide(n)) == (pre, post)


@given(st.integers(1, 4096))
def test_the_factors_multiply_to_n_and_the_first_is_a_power_of_two(n: int) -> None:
    pre = predivide(n)
    assert pre * postdivide(n) == pytest.approx(n, rel=1e-12)
    assert math.log2(pre).is_integer()
    # The doubling stops once f * f reaches N, so f never exceeds 2·sqrt(N).
    assert pre <= 2 * math.sqrt(n)


@given(st.integers(0, 12))
def test_powers_of_four_split_evenly(k: int) -> None:
    n = 4**k
    assert predivide(n) == postdivide(n) == 2**k


def test_no_ranks() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        predivide(0)


@pytest.mark.parametrize(
    ("dtype", "n", "force", "want"),
    [
        ("float32", 2, False, (None, None, "AVG", "AVG")),
        ("bfloat16", 4, False, (None, None, "AVG", "AVG")),
        ("float32", 1, False, (None, None, "SUM", "SUM")),
        ("float32", 2, True, (None, 2.0, "SUM", "SUM")),
        ("float16", 2, False, (2.0, 1.0, "SUM", "SUM")),
        ("float16", 4, False, (2.0, 2.0, "SUM", "SUM")),
        ("float16", 8, True, (4.0, 2.0, "SUM", "SUM")),
    ],
)
def test_fsdp2_factors(dtype: str, n: int, force: bool, want: tuple) -> None:
    assert fsdp2_factors(dtype, n, force_sum=force) == want


@given(st.integers(1, 512), st.integers(1, 8))
def test_fsdp2_sum_paths_are_a_mean(n: int, replicas: int) -> None:
    for dtype, force in (("float16", False), ("float32", True)):
        pre, post, rs_op, _ = fsdp2_factors(dtype, n, force_sum=force, replicas=replicas)
        assert rs_op == "SUM"
        assert (pre or 1) * post == pytest.approx(n * replicas, rel=1e-12)
