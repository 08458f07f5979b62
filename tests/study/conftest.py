"""Fixtures for the study commands' tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private user data directory, so scores never land in the real one."""
    where = tmp_path / "data"
    monkeypatch.setenv("FSDP_READINGS_DATA_DIR", str(where))
    return where
