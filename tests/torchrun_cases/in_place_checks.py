"""Run by tests/test_torchrun.py under ``torchrun --nproc-per-node=2``: every rank is a pytest process."""

import os

from checks.ranks.manager import PoolManager
from checks.ranks.protocol import CheckRequest


def test_checks_run_in_the_pytest_processes(pool: PoolManager) -> None:
    assert pool.mode == "torchrun"
    values = pool.run(CheckRequest("checks.ranks.selftest:identify")).values()
    assert [v["rank"] for v in values] == [0, 1]
    assert values[int(os.environ["RANK"])]["pid"] == os.getpid()
    assert pool.run(CheckRequest("checks.ranks.selftest:all_reduce_sum", {"value": 2.0})).values() == [6.0, 6.0]


def test_every_rank_sees_a_failure_on_one(pool: PoolManager) -> None:
    outcome = pool.run(CheckRequest("checks.ranks.selftest:raise_on", {"rank": 1, "then_barrier": False}))
    assert not outcome.ok
    assert "ValueError: deliberate failure on rank 1" in outcome.failure
    assert outcome.results[0].ok


def test_other_world_sizes_are_skipped(pool: PoolManager) -> None:
    outcome = pool.run(CheckRequest("checks.ranks.selftest:trivial", world_size=4))
    assert outcome.skipped == "torchrun started 2 ranks; this check is written for 4"
