"""Cost of one trivial check on 2 ranks: the persistent pool against spawning fresh ranks (what PyTorch's own
FSDP tests do per test). pytest-benchmark's table puts both in group "trivial-check" with their ratio.

    pytest benchmarks/test_pool_overhead.py
"""

from collections.abc import Iterator

import pytest

from checks.ranks.manager import PoolManager
from checks.ranks.protocol import CheckRequest

TRIVIAL = CheckRequest("checks.ranks.selftest:trivial", world_size=2)


@pytest.fixture(scope="module")
def warm_pool() -> Iterator[PoolManager]:
    manager = PoolManager(backend="gloo")
    assert manager.run(TRIVIAL).ok  # the ranks start here, outside the measurement
    yield manager
    manager.close()


@pytest.mark.benchmark(group="trivial-check")
def test_persistent_pool(benchmark, warm_pool: PoolManager) -> None:
    outcome = benchmark.pedantic(warm_pool.run, args=(TRIVIAL,), rounds=200, warmup_rounds=5)
    assert outcome.ok
    assert warm_pool.pools_started == 1


@pytest.mark.benchmark(group="trivial-check")
def test_fresh_spawn(benchmark) -> None:
    manager = PoolManager(backend="gloo", mode="fresh")
    try:
        outcome = benchmark.pedantic(manager.run, args=(TRIVIAL,), rounds=5)
    finally:
        manager.close()
    assert outcome.ok
    assert manager.pools_started == 5
