"""Guide 14: break the ring (a skipped step, a wrong chunk, chunks padded one element too many) and the naive
all-reduce (replaced by the ring), and watch each claim fail for its reason, on a shrunk example for the property
claims."""

from __future__ import annotations

import pytest

from checks.breakit.patches import wrapping
from checks.guides.g14_ring_all_reduce import (
    naive_is_the_ring,
    one_element_more_per_chunk,
    ring_of_independent_messages,
    send_the_next_chunk,
    skip_first_all_gather_step,
    skip_last_reduce_scatter_step,
)

RING = "checks.ring.ring"
SKIP_A_STEP = wrapping(f"{RING}:reduce_scatter_step", skip_last_reduce_scatter_step)
SKIP_AN_ALL_GATHER_STEP = wrapping(f"{RING}:all_gather_step", skip_first_all_gather_step)
WRONG_CHUNK = wrapping(f"{RING}:chunks_to_exchange", send_the_next_chunk)
OVER_PADDED = wrapping(f"{RING}:chunk_size", one_element_more_per_chunk)


def example(run) -> dict:
    return run.request.kwargs["example"]


# -- (1) the sums ----------------------------------------------------------------------------------------------------
@pytest.mark.breaks("14-ring-all-reduce", "ring-equals-all-reduce-at-2")
def test_a_ring_that_skips_a_step_is_caught_on_one_element(broken) -> None:
    # At N = 2 the one reduce-scatter step is skipped: each rank's chunk is only its own value.
    run = broken(SKIP_A_STEP)
    assert run.reason == "ring-differs-from-all-reduce"
    assert example(run)["numel"] == 1 and run.details["index"] == 0


@pytest.mark.breaks("14-ring-all-reduce", "ring-equals-all-reduce-at-3")
def test_a_ring_that_sends_a_wrong_chunk_is_caught_at_3(broken) -> None:
    run = broken(WRONG_CHUNK)
    assert run.reason == "ring-differs-from-all-reduce"
    assert example(run)["numel"] <= 3  # shrunk to one element per chunk or fewer


@pytest.mark.breaks("14-ring-all-reduce", "ring-equals-all-reduce-at-4")
def test_a_ring_without_its_first_all_gather_step_is_caught_at_4(broken) -> None:
    run = broken(SKIP_AN_ALL_GATHER_STEP)
    assert run.reason == "ring-differs-from-all-reduce"
    assert example(run)["numel"] <= 4


@pytest.mark.breaks("14-ring-all-reduce", "ring-equals-all-reduce-100-at-3")
def test_the_long_run_catches_a_skipped_step(broken) -> None:
    run = broken(SKIP_A_STEP)
    assert run.reason == "ring-differs-from-all-reduce" and example(run)["numel"] == 1


# -- (2) the bytes ---------------------------------------------------------------------------------------------------
@pytest.mark.breaks("14-ring-all-reduce", "bytes-are-the-bound-at-3")
def test_chunks_padded_one_element_too_many_are_caught(broken) -> None:
    # The sums are still right (the extra elements are zeros); the bytes are not: 2(N−1) extra elements.
    run = broken(OVER_PADDED)
    assert run.reason == "bytes-differ"
    itemsize = {"float32": 4, "float64": 8, "bfloat16": 2, "int64": 8}[example(run)["dtype"]]
    assert run.details["observed"] - run.details["expected"] == 4 * itemsize
    assert example(run)["numel"] == 1


@pytest.mark.breaks("14-ring-all-reduce", "ten-floats-at-4")
def test_a_ring_that_skips_a_step_sends_too_few_bytes(broken) -> None:
    run = broken(SKIP_A_STEP)
    assert run.reason == "bytes-differ"
    assert (run.details["observed"], run.details["expected"]) == (60, 72)  # five 12-byte chunks, not six


# -- (3) the steps ---------------------------------------------------------------------------------------------------
@pytest.mark.breaks("14-ring-all-reduce", "takes-2n-minus-1-steps-at-4")
def test_a_ring_that_skips_a_step_takes_five(broken) -> None:
    run = broken(SKIP_A_STEP)
    assert run.reason == "steps-differ"
    assert (run.details["observed"], run.details["expected"]) == (5, 6)


@pytest.mark.breaks("14-ring-all-reduce", "takes-2n-minus-1-steps-at-4")
def test_a_ring_that_sends_a_wrong_chunk_breaks_the_schedule(broken) -> None:
    run = broken(WRONG_CHUNK)
    assert run.reason == "schedule-differs"
    assert run.details["observed"][0][2] == (run.details["expected"][0][2] + 1) % 4


@pytest.mark.breaks("14-ring-all-reduce", "takes-2n-minus-1-steps-at-4")
def test_a_ring_whose_sends_wait_for_nothing_is_caught(broken) -> None:
    """Every message is the chunk as it was before any step, and the sum comes from `dist.all_reduce`. The old
    check compared the ring's own record of its steps with the model's schedule (the same formula twice), the
    messages' sizes and the sum: all right here, so it passed. The messages themselves do not carry the step
    before: the first reduce-scatter step already sends its bare chunk."""
    run = broken(wrapping(f"{RING}:ring_all_reduce", ring_of_independent_messages))
    assert (run.reason, run.details["step"]) == ("send-not-after-receive", 1)
    assert run.details["carries"] == "its own chunk + the message received at step 0"


# -- (4) the naive all-reduce ----------------------------------------------------------------------------------------
@pytest.mark.breaks("14-ring-all-reduce", "naive-overloads-rank-0-at-4")
def test_a_naive_all_reduce_that_is_a_ring_does_not_overload_rank_0(broken) -> None:
    run = broken(wrapping("checks.ring.naive:naive_all_reduce", naive_is_the_ring))
    assert run.reason == "naive-bytes-differ"
    assert (run.details["observed"], run.details["expected"]) == (6144, 3 * 4096)


@pytest.mark.breaks("14-ring-all-reduce", "naive-overloads-rank-0-at-4")
def test_an_over_padded_ring_is_over_the_bound(broken) -> None:
    run = broken(OVER_PADDED)
    assert run.reason == "ring-over-bound"
    assert run.details["observed"] == 6144 + 6 * 4
