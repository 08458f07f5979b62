"""Ring-model bytes per rank."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checks.models.ring import ring_bytes


def test_textbook_values() -> None:
    assert ring_bytes("all_reduce", 1000, 2) == 1000
    assert ring_bytes("all_reduce", 1000, 4) == 1500
    assert ring_bytes("all_gather", 1000, 4) == 750
    assert ring_bytes("reduce_scatter", 999, 2) == Fraction(999, 2)


@given(st.integers(0, 10**9), st.integers(1, 64))
def test_all_reduce_is_a_reduce_scatter_plus_an_all_gather(nbytes: int, n: int) -> None:
    assert ring_bytes("all_reduce", nbytes, n) == ring_bytes("reduce_scatter", nbytes, n) + ring_bytes(
        "all_gather", nbytes, n
    )
    assert ring_bytes("all_reduce", nbytes, n) < 2 * nbytes or nbytes == 0


def test_unknown_collective() -> None:
    with pytest.raises(ValueError, match="no ring model"):
        ring_bytes("all_to_all", 8, 2)
