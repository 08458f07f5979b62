"""Cost of the probes on a real step: FSDP1 over mini_gpt's tiny preset on 2 ranks, two steps per round, with each
probe alone, all three, and none. pytest-benchmark groups them in "probe-overhead".

    pytest benchmarks/test_probes_overhead.py

Measured on 2 busy cores (torch 2.13 CPU, seconds per step, from the rank): none 0.05, comm 0.07-0.09 (with its
profiler cross-check), events 0.06, memory without peaks 0.05, memory with torch's tracker 0.2.
"""

from collections.abc import Iterator

import pytest

from checks.manager import PoolManager
from checks.protocol import CheckRequest
from checks.selftest_probes import PROBES


@pytest.fixture(scope="module")
def warm_pool() -> Iterator[PoolManager]:
    manager = PoolManager(backend="gloo")
    assert manager.run(CheckRequest("checks.selftest:trivial", world_size=2)).ok
    yield manager
    manager.close()


@pytest.mark.benchmark(group="probe-overhead")
@pytest.mark.parametrize("probe", PROBES)
def test_probe_overhead(benchmark, warm_pool: PoolManager, probe: str) -> None:
    request = CheckRequest("checks.selftest_probes:mini_gpt_steps", kwargs={"probe": probe}, world_size=2)
    run = benchmark.pedantic(warm_pool.run, args=(request,), rounds=3, warmup_rounds=1)
    benchmark.extra_info["seconds_per_step_rank0"] = run.values()[0]["seconds_per_step"]
