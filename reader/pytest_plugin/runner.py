"""How a claim item reaches the rank pool, behind a seam tests (and other launchers) can replace.

A claim becomes a `checks.ranks.protocol.CheckRequest` (built by `reader.claims.request.traced_request`, the one
builder the plugin, the study commands and the break-it tests share) and comes back as a
`checks.ranks.protocol.CheckRun`, with every rank's returned value and, for a failure, its structured reason. The
protocol module is plain dataclasses: the reader imports it without importing torch. ``PoolRunner`` hands requests
to the session's pool manager (``checks.ranks.pytest_plugin.pool_manager(config)``); any object with ``run(request)
-> CheckRun`` can stand in, supplied through the ``pytest_reader_check_runner`` hook (see
``reader.pytest_plugin.hookspecs``).
"""

from __future__ import annotations

from typing import Protocol

import pytest

from checks.ranks.protocol import CheckRequest, CheckRun
from reader.claims.request import RankPoolUnavailable


class CheckRunner(Protocol):
    def run(self, request: CheckRequest) -> CheckRun: ...


class PoolRunner:
    """The default runner: the rank pool (one pool manager per pytest session, owned by its plugin)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def run(self, request: CheckRequest) -> CheckRun:
        try:
            from checks.ranks.pytest_plugin import pool_manager
        except ImportError as exc:
            raise RankPoolUnavailable(f"the rank pool (checks.ranks) cannot be imported: {exc}") from exc
        return pool_manager(self.config).run(request)
