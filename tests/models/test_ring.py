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


# -- guide 14: the padded ring, its schedule, the naive all-reduce, the (τ, β) fit ------------------------------------
from checks.models import ring  # noqa: E402
from checks.models.ring_draws import ITEMSIZE, examples, nbytes  # noqa: E402


def test_chunks_and_padding() -> None:
    assert (ring.chunk_numel(10, 4), ring.padding_numel(10, 4)) == (3, 2)
    assert (ring.chunk_numel(1, 4), ring.padding_numel(1, 4)) == (1, 3)  # three chunks of padding only
    assert (ring.chunk_numel(1024, 4), ring.padding_numel(1024, 4)) == (256, 0)
    assert ring.chunk_range(3, 10, 4) == (9, 12)


def test_ten_floats_on_four_ranks() -> None:
    # The guide's predict question: 6 steps of 3 float32 elements; bound 60 plus 12 for 8 bytes of padding.
    assert ring.ring_rank_bytes(10, 4, 4) == ring.RankBytes(72, 72)
    assert ring.ring_bytes("all_reduce", 40, 4) == 60
    assert ring.ring_padding_bytes(10, 4, 4) == 12


@given(st.integers(1, 10**6), st.sampled_from([1, 2, 4, 8]), st.integers(2, 16))
def test_ring_bytes_are_the_bound_plus_padding(numel: int, itemsize: int, n: int) -> None:
    sent = ring.ring_rank_bytes(numel, itemsize, n).sent
    assert sent == ring.ring_bytes("all_reduce", numel * itemsize, n) + ring.ring_padding_bytes(numel, itemsize, n)
    assert (sent == ring.ring_bytes("all_reduce", numel * itemsize, n)) == (numel % n == 0)


@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_schedule_is_the_seeds(n: int) -> None:
    for r in range(n):
        steps = ring.schedule(r, n)
        assert len(steps) == ring.ring_steps(n) == 2 * (n - 1)
        assert steps[0].as_tuple() == (ring.REDUCE_SCATTER, 0, r, (r - 1) % n)
        # one chain: every step sends what the step before received, across the phase boundary too
        assert all(steps[j].send_chunk == steps[j - 1].recv_chunk for j in range(1, len(steps)))
        assert steps[n - 2].recv_chunk == ring.owned_chunk(r, n)  # the last reduce-scatter step finishes it
        assert {s.recv_chunk for s in steps[n - 1 :]} == set(range(n)) - {ring.owned_chunk(r, n)}


@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_reduce_scatter_reduces(n: int) -> None:
    held = ring.contributions_after(n)
    for r in range(n):
        assert held[r][ring.owned_chunk(r, n)] == set(range(n))


def test_naive_overloads_rank_0() -> None:
    assert ring.naive_rank_bytes(4096, 0, 4) == ring.RankBytes(3 * 4096, 3 * 4096)
    assert ring.naive_rank_bytes(4096, 2, 4) == ring.RankBytes(4096, 4096)
    assert ring.naive_rank_bytes(4096, 0, 4).sent / ring.ring_bytes("all_reduce", 4096, 4) == 2
    assert ring.naive_rank_bytes(4096, 0, 2).sent == ring.ring_bytes("all_reduce", 4096, 2)  # N = 2: no worse


def test_seed_worked_example_corrected() -> None:
    # Seed 001: N = 4, S = 1 MB, τ = 50 µs, 1 GB/s. "≈ 2 MB" per worker is 1.5 MB; 2.3 ms is 1.8 ms.
    mb = 10**6
    assert ring.ring_bytes("all_reduce", mb, 4) == 1.5 * mb
    assert ring.ring_time(mb, 4, 50e-6, 1e-9) == pytest.approx(1.8e-3)


def test_fit_recovers_a_line() -> None:
    tau, beta = 40e-6, 2e-9
    points = [(s, ring.message_time(s, tau, beta)) for s in (1e3, 1e4, 1e5, 1e6, 4e6)]
    fitted = ring.fit_tau_beta(points)
    assert fitted == pytest.approx((tau, beta), rel=1e-9)
    with pytest.raises(ValueError):
        ring.fit_tau_beta([(1.0, 1.0)])


@given(examples())
def test_draws_are_plain_data(example: dict) -> None:
    assert set(example) == {"numel", "dtype", "seed"}
    assert example["numel"] >= 1 and nbytes(example) == example["numel"] * ITEMSIZE[example["dtype"]]
