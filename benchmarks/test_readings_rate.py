"""How fast ``pytest readings/`` proves claims on a warm pool: every claim of every guide, run once through the
same request path as its item (`reader.evidence.traced_request`), on pools already started for 2 and 4 ranks.

    pytest benchmarks/test_readings_rate.py

``extra_info`` holds the claim count and claims per second; compare rows of one run, not numbers in prose.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from checks.ranks.manager import PoolManager
from checks.ranks.protocol import CheckRequest
from reader.checkref import CheckFinder
from reader.evidence import traced_request
from reader.torch_source import open_source
from reader.workspace import LOCK_NAME, Workspace, load_all

READINGS = Path(__file__).resolve().parents[1] / "readings"


@pytest.fixture(scope="module")
def warm_pool() -> Iterator[PoolManager]:
    manager = PoolManager(backend="gloo")
    for world_size in (2, 4):
        assert manager.run(CheckRequest("checks.ranks.selftest:trivial", world_size=world_size)).ok
    yield manager
    manager.close()


def _requests() -> list[CheckRequest]:
    guides, broken = load_all([READINGS], CheckFinder(extra_paths=[READINGS.parent]))
    assert not broken, broken
    workspace = Workspace(open_source(None), READINGS / LOCK_NAME)
    return [traced_request(workspace, guide, claim)[0] for guide in guides for claim in guide.claims]


@pytest.mark.benchmark(group="readings-rate")
def test_claims_per_second(benchmark, warm_pool: PoolManager) -> None:
    requests = _requests()

    def run_all() -> int:
        return sum(warm_pool.run(request).ok for request in requests)

    passed = benchmark.pedantic(run_all, rounds=1, warmup_rounds=0)
    assert passed == len(requests)
    benchmark.extra_info["claims"] = len(requests)
    benchmark.extra_info["claims_per_second"] = round(len(requests) / benchmark.stats.stats.mean, 2)
