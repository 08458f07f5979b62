"""Break-it tests: run a guide's claim with torch bent on purpose and show the claim's check then fails.

A claim that still passes with the behaviour it asserts removed proves nothing. Every test here is marked
``@pytest.mark.breaks(guide_id, claim_id)``; `test_coverage.py` fails if a claim of any guide has no such test.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from checks.manager import PoolManager
from checks.protocol import CheckRequest, CheckRun, Patch
from reader.guide import ClaimSpec, Guide
from reader.parse import load_guide, looks_like_guide

READINGS = Path(__file__).resolve().parents[2] / "readings"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "breaks(guide_id, claim_id): the claim this break-it test must make fail")


@functools.cache
def guides() -> dict[str, Guide]:
    found = (load_guide(path) for path in sorted(READINGS.glob("*.md")) if looks_like_guide(path))
    return {guide.id: guide for guide in found}


def claim(guide_id: str, claim_id: str) -> ClaimSpec:
    by_id = {c.id: c for c in guides()[guide_id].claims}
    if claim_id not in by_id:
        raise KeyError(f"{guide_id} has no claim {claim_id!r}; it has {sorted(by_id)}")
    return by_id[claim_id]


def request_for(guide_id: str, claim_id: str, patches: tuple[Patch, ...], **overrides: Any) -> CheckRequest:
    spec = claim(guide_id, claim_id)
    kwargs = {**guides()[guide_id].claim_kwargs(spec), **overrides}
    return CheckRequest(spec.check, kwargs=kwargs, world_size=spec.world_size, patches=patches, timeout=spec.timeout)


BreakRunner = Callable[..., CheckRun]


@pytest.fixture
def broken(pool: PoolManager, request: pytest.FixtureRequest) -> BreakRunner:
    """``broken(*patches, **kwarg_overrides)`` runs the claim named by the test's ``breaks`` marker with the
    patches applied, asserts it failed, and returns the run so the test can check *why* it failed."""
    marker = request.node.get_closest_marker("breaks")
    assert marker is not None, "a break-it test needs @pytest.mark.breaks(guide_id, claim_id)"
    guide_id, claim_id = marker.args

    def run(*patches: Patch, **overrides: Any) -> CheckRun:
        outcome = pool.run(request_for(guide_id, claim_id, patches, **overrides))
        assert outcome.skipped is None, outcome.skipped
        assert not outcome.ok, f"{guide_id}::{claim_id} still passed with torch broken by {patches}"
        return outcome

    return run
