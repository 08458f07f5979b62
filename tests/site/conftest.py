"""One site built from the real guides on the installed torch, shared by this folder's tests (a build reads
every guide and resolves every anchor), with a data directory seeded with claim results and pictures."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from reader.claims.pictures import Pictures
from reader.claims.progress import Progress
from reader.source.torch_source import open_source
from tests.site.site_support import build

# Results seeded for guide 06: one held, one failed, one recorded on another torch (not shown on this one).
SEEDED = {"collective-order": "passed", "none-prefetches-nothing": "failed"}
OTHER_TORCH = ("first-unit-reused", "failed", "2.0.0")
SERIES = {"FULL_SHARD": [("after forward", {"params": 4096, "unsharded": 1200, "grads": 0}),
                         ("after backward", {"params": 2048, "unsharded": 16, "grads": 2048})]}  # fmt: skip


@dataclass(frozen=True)
class BuiltSite:
    out: Path
    data_dir: Path
    torch: str
    output: str


def installed_torch() -> str:
    source = open_source(None)
    try:
        assert source.version is not None
        return source.version
    finally:
        source.close()


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltSite]:
    data_dir = tmp_path_factory.mktemp("site-data")
    torch = installed_torch()
    progress = Progress(data_dir / "progress.json")
    for claim, result in SEEDED.items():
        progress.record_claim("06-backward-prefetch", claim, result, torch)
    progress.record_claim("06-backward-prefetch", OTHER_TORCH[0], OTHER_TORCH[1], OTHER_TORCH[2])
    progress.save()
    pictures = Pictures(data_dir / "pictures.json")
    assert pictures.record("06-backward-prefetch", "units-alive", ("memory",), {"series": SERIES}, torch)
    pictures.save()
    out = tmp_path_factory.mktemp("site")
    done = build(out, data_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    yield BuiltSite(out, data_dir, torch, done.stdout)
