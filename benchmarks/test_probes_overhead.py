"""Cost of the probes on a real step: FSDP1 over mini_gpt's tiny preset on 2 ranks, with each probe alone, all
three (`record_step`'s default), and the opt-in memory peaks alone and with the others. pytest-benchmark groups
them in "probe-overhead" and times each request; the ratio a regression shows in is in ``extra_info``, measured
inside the rank (`tests.probes.on_ranks.mini_gpt_overhead`): bare and probed steps interleaved on the same model,
best round of each, so a busy machine slows both sides alike.

- ``ratio_to_bare``: rank 0's wall seconds per probed step over its bare ones (``seconds_per_step_rank0``,
  ``bare_seconds_per_step_rank0``);
- ``cpu_ratio_to_bare``: the same in rank 0's main-thread CPU seconds: the probe's own work, without the waits
  for the other rank and the noise of other processes.

    pytest benchmarks/test_probes_overhead.py

The numbers belong to the benchmark table of a run, not here: compare rows of one run.
"""

from collections.abc import Iterator

import pytest

from checks.ranks.manager import PoolManager
from checks.ranks.protocol import CheckRequest
from tests.probes.on_ranks import PROBES


@pytest.fixture(scope="module")
def warm_pool() -> Iterator[PoolManager]:
    manager = PoolManager(backend="gloo")
    assert manager.run(CheckRequest("checks.ranks.selftest:trivial", world_size=2)).ok
    yield manager
    manager.close()


@pytest.mark.benchmark(group="probe-overhead")
@pytest.mark.parametrize("probe", PROBES)
def test_probe_overhead(benchmark, warm_pool: PoolManager, probe: str) -> None:
    request = CheckRequest("tests.probes.on_ranks:mini_gpt_overhead", kwargs={"probe": probe}, world_size=2)
    rounds: list[dict[str, float]] = []

    def measure() -> None:
        run = warm_pool.run(request)
        assert run.ok, run.failure
        rounds.append(run.values()[0])

    benchmark.pedantic(measure, rounds=2, warmup_rounds=0)
    best = min(rounds, key=lambda r: r["ratio_to_bare"])  # each round is already a best of three inside the rank
    benchmark.extra_info["seconds_per_step_rank0"] = round(best["seconds_per_step"], 5)
    benchmark.extra_info["bare_seconds_per_step_rank0"] = round(best["bare_seconds_per_step"], 5)
    benchmark.extra_info["ratio_to_bare"] = round(best["ratio_to_bare"], 3)
    benchmark.extra_info["cpu_ratio_to_bare"] = round(min(r["cpu_ratio_to_bare"] for r in rounds), 3)
    if probe == "none":  # the same steps on both sides: the measurement's own noise floor
        assert 0.5 < best["ratio_to_bare"] < 2.0
