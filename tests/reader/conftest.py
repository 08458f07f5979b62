"""Fixtures for the reader's tests (helpers live in ``reader_support``). Nothing here touches the network or
the real torch wheel. pytester is enabled here (a non-root conftest may not set ``pytest_plugins``), so these
tests run whether or not the root conftest loads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reader.format.body import BODY_PARSERS, register_body_parser
from reader.source import torch_source
from reader.source.index import IndexCache
from tests.reader.reader_support import TorchTree, make_tree, quiz_blocks


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("pytester"):
        config.pluginmanager.import_plugin("pytester")
    config.addinivalue_line("markers", "shared_index_cache: share one index cache with other such tests")


@pytest.fixture
def torch_tree(tmp_path: Path) -> TorchTree:
    return make_tree(tmp_path / "site-packages")


@pytest.fixture(scope="session")
def _shared_cache_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared-index-cache")


@pytest.fixture(autouse=True)
def _isolated_cache(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """Each test gets its own on-disk index cache and an empty in-memory one, so cache tests count honestly. A
    module marked ``shared_index_cache`` (one that reads the real guides and counts no cache) shares one with
    every such module, so the installed torch is indexed once, not once a test."""
    if request.node.get_closest_marker("shared_index_cache") is not None:
        directory = request.getfixturevalue("_shared_cache_directory")
        monkeypatch.setenv("FSDP_READINGS_CACHE", str(directory))
        yield directory
        return
    directory = tmp_path_factory.mktemp("index-cache")
    monkeypatch.setenv("FSDP_READINGS_CACHE", str(directory))
    IndexCache.clear_memory()
    yield directory
    IndexCache.clear_memory()


@pytest.fixture
def installed_tree(torch_tree: TorchTree, monkeypatch: pytest.MonkeyPatch) -> TorchTree:
    """Make the synthetic tree the 'installed' torch for this test (in-process pytester runs see it too)."""
    monkeypatch.setattr(torch_source, "installed_root", lambda: torch_tree.root)
    return torch_tree


@pytest.fixture
def quiz_parser() -> Iterator[str]:
    """Register the made-up ```quiz fence kind for one test (the way a module adding a kind would)."""
    register_body_parser("quiz", quiz_blocks)
    try:
        yield "quiz"
    finally:
        BODY_PARSERS.unregister("quiz")
