"""Hooks ``reader.pytest_plugin.hooks`` adds to pytest."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from reader.pytest_plugin.runner import CheckRunner


@pytest.hookspec(firstresult=True)
def pytest_reader_check_runner(config: pytest.Config) -> CheckRunner | None:
    """Return the object claim items send their checks to (called once per session).

    The default (``reader.pytest_plugin.runner.PoolRunner``) sends them to the rank pool of ``checks``. A conftest can
    return any object with ``run(request: CheckRequest) -> CheckRun`` (both from ``checks.ranks.protocol``),
    e.g. a fake in the reader's own tests::

        def pytest_reader_check_runner(config):
            return FakeRunner()
    """
