"""The rank pool: answers from every rank, failures with their tracebacks, signals and stacks, clean processes."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch

from checks.ranks.manager import PoolManager
from checks.ranks.pool import RankPool
from checks.ranks.protocol import CheckRequest, Patch


@pytest.fixture
def manager() -> Iterator[PoolManager]:
    """A manager of its own for tests that break pools on purpose: the session's pool must not suffer."""
    m = PoolManager(backend="gloo", timeout=30)
    yield m
    m.close()
    _assert_gone(m.spawned_pids)


@pytest.fixture(scope="module")
def shared() -> Iterator[PoolManager]:
    """One manager for the tests that leave their pool intact (starting ranks costs seconds)."""
    m = PoolManager(backend="gloo", timeout=30)
    yield m
    m.close()
    _assert_gone(m.spawned_pids)


def _assert_gone(pids: list[int]) -> None:
    alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"rank processes {alive} are still alive"


def run(manager: PoolManager, target: str, world_size: int = 2, **kwargs: object) -> object:
    return manager.run(CheckRequest(f"checks.ranks.selftest:{target}", kwargs=dict(kwargs), world_size=world_size))


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_rank_answers(shared: PoolManager, world_size: int) -> None:
    outcome = run(shared, "identify", world_size)
    assert outcome.ok, outcome.failure
    values = outcome.values()
    assert [v["rank"] for v in values] == list(range(world_size))
    assert {v["world_size"] for v in values} == {world_size}
    assert {v["backend"] for v in values} == {"gloo"}
    assert len({v["pid"] for v in values}) == world_size
    sums = run(shared, "all_reduce_sum", world_size, value=2.0).values()
    assert sums == [2.0 * world_size * (world_size + 1) / 2] * world_size


def test_pool_is_reused_across_checks(manager: PoolManager) -> None:
    """Same processes for every check; counted by the pool itself."""
    first = [v["pid"] for v in run(manager, "identify").values()]
    for _ in range(3):
        assert run(manager, "trivial").ok
    assert [v["pid"] for v in run(manager, "identify").values()] == first
    assert manager.pools_started == 1
    assert manager.pool(2).checks_run == 5


def test_exception_reports_rank_and_traceback_and_unblocks_others(manager: PoolManager) -> None:
    before = run(manager, "identify").values()
    outcome = run(manager, "raise_on", rank=1)
    assert not outcome.ok
    failed = {r.rank: r for r in outcome.results}
    assert "ValueError: deliberate failure on rank 1" in failed[1].error
    assert 'selftest.py", line' in failed[1].error and "in raise_on" in failed[1].error
    assert outcome.failure.startswith("checks.ranks.selftest:raise_on failed on ranks 0, 1")
    assert "── rank 1: ValueError: deliberate failure on rank 1" in outcome.failure
    # Rank 0 was blocked in the second barrier: it is reported with its stack, then stopped.
    assert "after rank 1 failed" in failed[0].error
    assert "in raise_on" in failed[0].stack and "in barrier" in failed[0].stack
    _assert_gone([v["pid"] for v in before])
    after = run(manager, "identify").values()  # a new pool serves the next check
    assert manager.pools_started == 2
    assert {v["pid"] for v in after}.isdisjoint(v["pid"] for v in before)


def test_failure_on_every_rank_keeps_the_pool(shared: PoolManager) -> None:
    pids = [v["pid"] for v in run(shared, "identify").values()]
    outcome = run(shared, "raise_on", rank=-1)  # nobody raises
    assert outcome.ok
    outcome = shared.run(CheckRequest("checks.ranks.selftest:returns_unpicklable"))
    assert not outcome.ok
    assert all("cannot be sent back from the rank" in r.error for r in outcome.results)
    assert "── ranks 0, 1: TypeError: checks.ranks.selftest:returns_unpicklable returned a function" in outcome.failure
    assert outcome.failure.count("── ") == 1  # the same error on every rank is reported once
    assert [v["pid"] for v in run(shared, "identify").values()] == pids  # same SPMD failure: group intact


def test_timeout_dumps_every_hung_rank_stack(manager: PoolManager) -> None:
    pids = [v["pid"] for v in run(manager, "identify").values()]
    outcome = manager.run(CheckRequest("checks.ranks.selftest:hang_on", kwargs={"rank": 1}, timeout=2))
    assert not outcome.ok
    rank0, rank1 = outcome.results
    assert rank0.ok
    assert "timed out after 2 s" in rank1.error
    assert "in hang_on" in rank1.stack and "Current thread" in rank1.stack
    assert "rank 1: timed out after 2 s" in outcome.failure
    _assert_gone(pids)


@pytest.mark.parametrize(("how", "signal_name"), [("segfault", "SIGSEGV"), ("abort", "SIGABRT"), ("kill", "SIGKILL")])
def test_dead_rank_is_reported_with_its_signal(manager: PoolManager, how: str, signal_name: str) -> None:
    pids = [v["pid"] for v in run(manager, "identify").values()]
    outcome = run(manager, "crash_on", rank=1, how=how)
    assert not outcome.ok
    dead = outcome.results[1]
    assert dead.signal == signal_name
    assert f"rank 1: died of {signal_name}" in outcome.failure
    if how != "kill":  # faulthandler cannot run on SIGKILL; on the others it leaves the Python traceback
        assert "in crash_on" in dead.stack
    _assert_gone(pids)
    assert run(manager, "trivial").ok


def test_a_group_that_fails_the_health_check_retires_the_pool(manager: PoolManager) -> None:
    outcome = run(manager, "poison_all_reduce")
    assert outcome.ok, outcome.failure  # the check itself passed; the Verify that follows it did not
    broken = manager.pool(2)
    assert broken is not None and broken.broken
    first_pids = broken.pids
    assert run(manager, "identify").ok
    assert manager.pools_started == 2 and manager.pool(2).pids != first_pids


def test_rank_exit_code_is_reported(manager: PoolManager) -> None:
    outcome = run(manager, "exit_on", rank=0, code=3)
    assert outcome.results[0].error == "rank 0 exited with code 3"


def test_isolation_between_checks(shared: PoolManager) -> None:
    baseline = run(shared, "observe_state").values()
    torch.manual_seed(0)  # the pool seeds every check with seed 0: the first draw is known independently
    first_draw = torch.rand(1).item()
    assert {v["random"] for v in baseline} == {first_draw}
    assert run(shared, "leak_state").ok
    assert run(shared, "observe_state").values() == baseline
    assert run(shared, "train_fsdp_and_ddp").ok
    assert run(shared, "live_wrappers").values() == [{"fsdp1": 0, "ddp": 0, "fsdp2": 0}] * 2


def test_live_wrapper_probe_can_see_a_leak(shared: PoolManager) -> None:
    """The isolation test above is only as good as `live_wrappers`: show it sees what a check leaves behind."""
    assert run(shared, "keep_wrapper_alive").ok
    assert [v["fsdp1"] for v in run(shared, "live_wrappers").values()] == [1, 1]
    assert run(shared, "keep_wrapper_alive", keep=False).ok
    assert [v["fsdp1"] for v in run(shared, "live_wrappers").values()] == [0, 0]


def test_patch_reaches_every_importer_and_is_undone(shared: PoolManager) -> None:
    # torch.distributed re-exports get_world_size from distributed_c10d: both names must see the patch.
    patch = Patch("torch.distributed.distributed_c10d:get_world_size", "checks.breakit.sabotage:returns", {"value": 99})
    outcome = shared.run(CheckRequest("checks.ranks.selftest:identify", patches=(patch,)))
    assert [v["world_size"] for v in outcome.values()] == [99, 99]
    assert [v["world_size"] for v in run(shared, "identify").values()] == [2, 2]


def test_trace_reports_which_symbols_ran(shared: PoolManager) -> None:
    trace = (
        "torch.distributed.distributed_c10d:all_reduce",  # wrapped by a logging decorator: unwrapped rank-side
        "torch.distributed.distributed_c10d:broadcast",
        "torch.nn.modules.linear:Linear",  # a class: any of its methods
        "checks.ranks.selftest:all_reduce_sum",
    )
    outcome = shared.run(CheckRequest("checks.ranks.selftest:all_reduce_sum", trace=trace))
    assert outcome.executed == {"torch.distributed.distributed_c10d:all_reduce", "checks.ranks.selftest:all_reduce_sum"}
    outcome = shared.run(CheckRequest("checks.ranks.selftest:train_fsdp_and_ddp", trace=trace))
    assert "torch.nn.modules.linear:Linear" in outcome.executed


def test_fresh_mode_spawns_per_check() -> None:
    m = PoolManager(backend="gloo", mode="fresh")
    try:
        first = [v["pid"] for v in run(m, "identify").values()]
        second = [v["pid"] for v in run(m, "identify").values()]
    finally:
        m.close()
    assert set(first).isdisjoint(second)
    assert m.pools_started == 2
    _assert_gone(first + second)


def test_graceful_close_exits_every_rank_cleanly(manager: PoolManager) -> None:
    assert run(manager, "train_fsdp_and_ddp").ok
    pool = manager.pool(2)
    manager.close()
    assert [r.proc.returncode for r in pool._ranks] == [0, 0]  # no SIGABRT from gloo's destructors


def test_two_pools_at_once_do_not_collide() -> None:
    """Two sessions on one machine: each pool rendezvous through its own store file; gloo uses ephemeral ports."""
    a, b = PoolManager(backend="gloo"), PoolManager(backend="gloo")
    try:
        assert run(a, "all_reduce_sum").ok and run(b, "all_reduce_sum").ok
        assert run(a, "all_reduce_sum", value=3.0).values() == [9.0, 9.0]
    finally:
        a.close()
        b.close()


def test_ranks_die_with_their_parent(tmp_path) -> None:
    """Even a SIGKILLed pytest leaves no ranks behind."""
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent("""
        import sys, time
        from checks.ranks.manager import PoolManager
        from checks.ranks.protocol import CheckRequest
        m = PoolManager(backend="gloo")
        values = m.run(CheckRequest("checks.ranks.selftest:identify")).values()
        print(" ".join(str(v["pid"]) for v in values), flush=True)
        time.sleep(600)
    """)
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids):
            time.sleep(0.1)
        _assert_gone(pids)
        # Its files outlive it, until the next pool anywhere on the machine sweeps them.
        leftovers = list(Path(tempfile.gettempdir()).glob(f"fsdp-readings-pool-{parent.pid}-*"))
        assert leftovers, "expected the killed parent's pool directory to be left behind"
        RankPool(2, "gloo").close()  # creating a pool sweeps directories of dead owners
        assert not [p for p in leftovers if p.exists()], f"orphaned pool directories not swept: {leftovers}"
    finally:
        parent.kill()


def test_a_check_written_for_another_backend_is_skipped_with_the_reason(pool) -> None:
    # A check written for the other backend does not run, and says why (no rank starts for it).
    used = pool.backend_for(2)
    other = "nccl" if used == "gloo" else "gloo"
    outcome = pool.run(CheckRequest("checks.ranks.selftest:identify", backends=(other,)))
    assert outcome.skipped == f"checks.ranks.selftest:identify is written for {other}; this run uses {used}"
    assert outcome.results == []
    assert pool.run(CheckRequest("checks.ranks.selftest:identify", backends=("gloo", "nccl"))).ok
