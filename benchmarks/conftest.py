"""Fixtures the benchmark suites share, and a summary of the ratios they record."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

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


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """pytest-benchmark's table has no column for ``extra_info``, where the ratios are: list them under it."""
    session = getattr(config, "_benchmarksession", None)
    rows = [(b.group or "", b.name, b.extra_info) for b in getattr(session, "benchmarks", []) if b.extra_info]
    if not rows:
        return
    terminalreporter.section("benchmark extra_info")
    width = max(len(name) for _, name, _ in rows)
    for group, name, info in sorted(rows, key=lambda r: (r[0], r[1])):
        cells = "  ".join(f"{key}={value}" for key, value in info.items() if not isinstance(value, dict))
        terminalreporter.write_line(f"{group:16s} {name:{width}s}  {cells}")
        for key, table in info.items():  # a table (phase -> seconds) gets a row each
            if isinstance(table, dict):
                terminalreporter.write_line(f"  {key}:")
                label = max(len(str(k)) for k in table)
                for phase, value in table.items():
                    terminalreporter.write_line(f"    {phase:{label}s}  {value:>8}")
