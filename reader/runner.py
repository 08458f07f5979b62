"""How a claim item reaches the rank pool, behind a seam tests (and other launchers) can replace.

The reader does not import ``checks`` at import time: ``PoolRunner`` adapts a ``ClaimRequest`` to
``checks.pool.CheckRequest`` and calls ``checks.pytest_plugin.pool_manager(config).run``. Any object with a
``run(request) -> outcome`` method can stand in; supply it through the ``pytest_reader_check_runner`` hook
(see ``reader.hookspecs``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import pytest


@dataclass(frozen=True)
class ClaimRequest:
    """Field for field what ``checks.pool.CheckRequest`` takes."""

    target: str  # "checks.prefetch:backward_pre_order"
    kwargs: Mapping[str, Any]
    world_size: int
    trace: tuple[str, ...]  # torch symbols whose code objects the ranks trace
    timeout: float | None  # None: the pool's default


class CheckOutcome(Protocol):
    """What ``checks.pool.CheckRun`` provides and claim items read."""

    ok: bool
    failure: str | None
    executed: frozenset[str]
    skipped: str | None


class CheckRunner(Protocol):
    def run(self, request: ClaimRequest) -> CheckOutcome: ...


class PoolRunner:
    """The default runner: the rank pool from ``checks`` (one pool per pytest session, owned by its
    plugin)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def run(self, request: ClaimRequest) -> CheckOutcome:
        try:
            from checks.pool import CheckRequest
            from checks.pytest_plugin import pool_manager
        except ImportError as exc:
            raise RankPoolUnavailable(
                f"the rank pool (checks.pool, checks.pytest_plugin) cannot be imported: {exc}"
            ) from exc
        return pool_manager(self.config).run(
            CheckRequest(
                target=request.target,
                kwargs=dict(request.kwargs),
                world_size=request.world_size,
                trace=request.trace,
                timeout=request.timeout,
            )
        )


class RankPoolUnavailable(RuntimeError):
    pass
