"""The all-gather rate limiter's queue model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checks.models.rate_limiter import KINDS, queue_calls


def test_a_step_that_reaches_the_limit() -> None:
    events = ["unshard", "free", "unshard", "free", "prefetch", "free", "unshard"]
    assert queue_calls(events, pending=0, limit=2) == [
        "unshard 0 go", "queue 1", "unshard 1 go", "queue 2", "unshard 2 wait", "queue 2", "unshard 2 wait",
    ]  # fmt: skip


def test_an_unknown_event_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown event"):
        queue_calls(["all_reduce"], 0, 2)


@given(st.lists(st.sampled_from(KINDS), max_size=40), st.integers(0, 5), st.integers(1, 4))
def test_each_unshard_retires_at_most_one_and_waits_only_at_the_limit(events: list[str], pending: int, limit: int):
    calls = queue_calls(events, pending, limit)
    assert len(calls) == len(events)
    queued = pending
    for kind, call in zip(events, calls, strict=True):
        if kind == "free":
            queued += 1
            assert call == f"queue {queued}"
        else:
            waits = call.endswith("wait")
            assert call.startswith(f"unshard {queued} ") and waits == (queued >= limit)
            queued -= waits
