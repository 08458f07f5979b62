"""How long ``fsdp-readings site`` takes to write every guide (pytest-benchmark): the whole build in process,
from parsing the guides to the last page, with the anchor index cache warm (as after any ``show`` or ``pytest
readings/``) and cold, and the share of it that each guide's page takes. No claim runs in either.

Run: ``pytest benchmarks/test_site_build.py --benchmark-only``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from reader.format.parse import load_all
from reader.gate.workspace import LOCK_NAME, Workspace
from reader.site.build import build_site
from reader.source.checkref import CheckFinder
from reader.source.index import IndexCache
from reader.source.torch_source import open_source

READINGS = Path(__file__).resolve().parents[1] / "readings"


def _build(out: Path, cache: IndexCache) -> int:
    guides, broken = load_all([READINGS], CheckFinder(extra_paths=[READINGS.parent]))
    assert not broken
    workspace = Workspace(open_source(None), READINGS / LOCK_NAME, cache=cache)
    try:
        return len(build_site(guides, READINGS, workspace, out).guides)
    finally:
        workspace.source.close()


@pytest.mark.parametrize("cache", ["warm", "cold"])
def test_site_build(benchmark: Any, tmp_path: Path, cache: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FSDP_READINGS_DATA_DIR", str(tmp_path / "data"))

    def fresh() -> IndexCache:  # warm: the on-disk index cache; cold: none, every file parsed again
        return IndexCache() if cache == "warm" else IndexCache(use_default=False)

    pages = benchmark.pedantic(
        lambda: _build(tmp_path / f"site-{time.perf_counter_ns()}", fresh()),
        rounds=3, iterations=1,
    )  # fmt: skip
    benchmark.extra_info["pages"] = pages
    benchmark.extra_info["seconds_per_page"] = round(benchmark.stats.stats.mean / pages, 3)
