"""Cost of the probes on a real step: FSDP1 over mini_gpt's tiny preset on 2 ranks, two steps per round, with each
probe alone, all three (without and with memory peaks), and none. pytest-benchmark groups them in
"probe-overhead"; each row's ``extra_info`` has rank 0's seconds per step and its ratio to the bare step of the
same run (``ratio_to_bare``), so a regression shows in the table.

    pytest benchmarks/test_probes_overhead.py

The numbers belong to the benchmark table of a run, not here: compare rows of one run.
"""

from collections.abc import Iterator

import pytest

from checks.probes.selftest import PROBES
from checks.ranks.manager import PoolManager
from checks.ranks.protocol import CheckRequest

BARE: dict[str, float] = {}  # rank 0's seconds per step without probes, measured first (PROBES starts with "none")


@pytest.fixture(scope="module")
def warm_pool() -> Iterator[PoolManager]:
    manager = PoolManager(backend="gloo")
    assert manager.run(CheckRequest("checks.ranks.selftest:trivial", world_size=2)).ok
    yield manager
    manager.close()


@pytest.mark.benchmark(group="probe-overhead")
@pytest.mark.parametrize("probe", PROBES)
def test_probe_overhead(benchmark, warm_pool: PoolManager, probe: str) -> None:
    request = CheckRequest("checks.probes.selftest:mini_gpt_steps", kwargs={"probe": probe}, world_size=2)
    run = benchmark.pedantic(warm_pool.run, args=(request,), rounds=3, warmup_rounds=1)
    seconds = run.values()[0]["seconds_per_step"]
    benchmark.extra_info["seconds_per_step_rank0"] = seconds
    if probe == "none":
        BARE["seconds"] = seconds
    if "seconds" in BARE:
        benchmark.extra_info["ratio_to_bare"] = round(seconds / BARE["seconds"], 3)
