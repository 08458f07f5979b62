"""Structured failures: a check's `Violation` comes back with its reason and details; any other exception with
its type and message. Break-it tests and study views read these, not the rendered traceback."""

from __future__ import annotations

import pytest

from checks.ranks.manager import PoolManager
from checks.ranks.protocol import CheckRequest
from checks.violation import Violation, require, require_equal


def run(pool: PoolManager, target: str, **kwargs: object):
    return pool.run(CheckRequest(f"checks.ranks.selftest:{target}", kwargs=dict(kwargs)))


def test_a_violation_carries_its_reason_and_details(pool: PoolManager) -> None:
    outcome = run(pool, "violate_on", rank=1)
    assert not outcome.ok and [r.rank for r in outcome.failed] == [1]
    assert outcome.reason == "held-after-forward"
    assert outcome.details == {"observed": {"blocks.0": 64080}, "expected": {"blocks.0": 0}}
    [failed] = outcome.failed
    assert failed.error_type == "checks.violation.Violation"
    assert failed.message == "bytes held: {'blocks.0': 64080}, expected {'blocks.0': 0}"
    assert "Traceback" in failed.error and "rank 1" in outcome.failure  # the rendering for people stays


def test_any_other_exception_has_a_type_and_message_but_no_reason(pool: PoolManager) -> None:
    outcome = run(pool, "raise_on", rank=1, then_barrier=False)
    assert outcome.reason is None and outcome.details == {}
    assert outcome.error_types == {"builtins.ValueError"}
    assert [r.message for r in outcome.failed] == ["deliberate failure on rank 1"]


def test_details_that_cannot_travel_arrive_as_their_repr(pool: PoolManager) -> None:
    outcome = run(pool, "violation_with_unpicklable_details")
    assert outcome.reason == "odd-details"
    assert outcome.details["n"] == 3 and outcome.details["fn"].startswith("<function")


def test_a_reason_must_be_kebab_case() -> None:
    with pytest.raises(ValueError, match="kebab-case"):
        Violation("Held After Forward", "x")


def test_require_and_require_equal() -> None:
    require(True, "never", "not raised")
    with pytest.raises(Violation) as caught:
        require_equal([1, 2], [1, 3], reason="sizes", what="sizes", step=2)
    assert caught.value.reason == "sizes"
    assert caught.value.details == {"observed": [1, 2], "expected": [1, 3], "step": 2}
