"""Helpers for the probes' tests: run a ``tests.probes.on_ranks`` function on the session's rank pool."""

from __future__ import annotations

from typing import Any

import pytest

from checks.ranks.manager import PoolManager
from checks.ranks.protocol import CheckRequest, Patch


class Ranks:
    def __init__(self, pool: PoolManager) -> None:
        self.pool = pool

    def __call__(
        self,
        function: str,
        world_size: int = 2,
        patches: tuple[Patch, ...] = (),
        trace: tuple[str, ...] = (),
        **kw: Any,
    ) -> list[Any]:
        request = CheckRequest(
            f"tests.probes.on_ranks:{function}", kwargs=kw, world_size=world_size, patches=patches, trace=trace
        )
        run = self.pool.run(request)
        if run.skipped:
            pytest.skip(run.skipped)
        self.last = run
        return run.values()  # raises with every rank's traceback if the check failed


@pytest.fixture
def ranks(pool: PoolManager) -> Ranks:
    return Ranks(pool)
