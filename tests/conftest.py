"""The suite's own tests never touch the learner's real progress file: every test gets a private user data
directory (``FSDP_READINGS_DATA_DIR``), which the processes it starts inherit. The guides' own items
(``readings/``) are not under this conftest: ``pytest readings/`` records claim results where ``list`` reads them."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def private_progress(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path_factory.mktemp("fsdp-readings-data")
    monkeypatch.setenv("FSDP_READINGS_DATA_DIR", str(where))
    return where
