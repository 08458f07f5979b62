"""Fixtures the benchmark suites share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from checks.ranks.manager import PoolManager
from checks.ranks.protocol import CheckRequest


@pytest.fixture(scope="module")
def warm_pool() -> Iterator[PoolManager]:
    """gloo pools already started for 2 and 4 ranks, so a benchmark measures checks, not rank start-up."""
    manager = PoolManager(backend="gloo")
    for world_size in (2, 4):
        assert manager.run(CheckRequest("checks.ranks.selftest:trivial", world_size=world_size)).ok
    yield manager
    manager.close()
