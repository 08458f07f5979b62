"""Ranks forked from a zygote (`checks.ranks.zygote`): what a rank started as its own interpreter had, they have
(a session of their own, the pool's environment and search path, death with the pool's process), and when the
zygote is gone or cannot start, ranks start as interpreters again."""

from __future__ import annotations

import os
import signal
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from checks.ranks import zygote as zygotes
from checks.ranks.manager import PoolManager
from checks.ranks.pool import RankPool
from checks.ranks.protocol import CheckRequest


def process(manager: PoolManager, **kwargs: object) -> list[dict[str, object]]:
    run = manager.run(CheckRequest("checks.ranks.selftest:process", kwargs=dict(kwargs)))
    assert run.ok, run.failure
    return run.values()


@pytest.fixture
def manager() -> Iterator[PoolManager]:
    m = PoolManager(backend="gloo", timeout=30)
    yield m
    m.close()


def _live(pid: int) -> bool:
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


def test_ranks_are_children_of_the_zygote_each_in_a_session_of_its_own(manager: PoolManager) -> None:
    values = process(manager)
    parents = {v["parent"] for v in values}
    assert len(parents) == 1 and parents != {os.getpid()}
    [parent] = parents
    assert "checks.ranks.zygote" in " ".join(psutil.Process(parent).cmdline())
    assert psutil.Process(parent).ppid() == os.getpid()
    assert all(v["session"] == v["pid"] for v in values)  # killpg(pid) stops one rank and nothing else


def test_pools_of_a_session_share_one_zygote(manager: PoolManager) -> None:
    first = {v["parent"] for v in process(manager)}
    four = manager.run(CheckRequest("checks.ranks.selftest:process", world_size=4))
    assert {v["parent"] for v in four.values()} == first


def test_a_rank_sees_the_search_path_the_pool_had_when_it_started(
    manager: PoolManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test that puts a sabotage module on ``sys.path`` after the zygote started still reaches its ranks."""
    process(manager)  # the zygote runs
    (tmp_path / "late_module_for_ranks.py").write_text("VALUE = 1\n")
    assert not any(v["module_found"] for v in process(manager, module="late_module_for_ranks"))
    monkeypatch.syspath_prepend(str(tmp_path))
    other = PoolManager(backend="gloo", timeout=30)
    try:
        assert all(v["module_found"] for v in process(other, module="late_module_for_ranks"))
    finally:
        other.close()


def test_another_environment_gets_a_zygote_of_its_own(manager: PoolManager, monkeypatch: pytest.MonkeyPatch) -> None:
    """A variable an import could read (torch reads many) is set before the imports: by a zygote of its own."""
    before = process(manager, variable="ZYGOTE_TEST_AT_IMPORT")
    monkeypatch.setenv("ZYGOTE_TEST_AT_IMPORT", "set")
    other = PoolManager(backend="gloo", timeout=30)
    try:
        after = process(other, variable="ZYGOTE_TEST_AT_IMPORT")
    finally:
        other.close()
    assert {v["variable"] for v in before} == {None} and {v["variable"] for v in after} == {"set"}
    assert {v["parent"] for v in after}.isdisjoint(v["parent"] for v in before)


def test_the_projects_own_variables_reach_the_ranks_from_the_same_zygote(
    manager: PoolManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``FSDP_READINGS_*`` is read when used, so a pool with other values forks from the same zygote (every test
    here has a data directory of its own) and its ranks see the pool's values, an unset one unset."""
    monkeypatch.setenv("FSDP_READINGS_ZYGOTE_TEST", "first")
    first = process(manager)
    monkeypatch.setenv("FSDP_READINGS_ZYGOTE_TEST", "second")
    for expected in ("second", None):
        other = PoolManager(backend="gloo", timeout=30)
        try:
            values = process(other)
        finally:
            other.close()
        assert {v["variable"] for v in values} == {expected}
        assert {v["parent"] for v in values} == {v["parent"] for v in first}
        monkeypatch.delenv("FSDP_READINGS_ZYGOTE_TEST", raising=False)
    assert {v["variable"] for v in first} == {"first"}


def test_a_killed_zygote_takes_its_ranks_and_the_next_pool_forks_from_a_new_one(
    manager: PoolManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A zygote of this test's own: the session's serves the session's pools, whose ranks would die with it.
    monkeypatch.setenv("ZYGOTE_TEST_KILLED", "own zygote")
    values = process(manager)
    [zygote_pid] = {v["parent"] for v in values}
    os.kill(zygote_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_live(v["pid"]) for v in values):
        time.sleep(0.1)
    assert not any(_live(v["pid"]) for v in values), "ranks outlived their zygote"
    broken = manager.run(CheckRequest("checks.ranks.selftest:identify"))
    assert not broken.ok and all("SIGKILL" in (r.error or "") for r in broken.results), broken.failure
    again = process(manager)
    assert {v["parent"] for v in again} != {zygote_pid} and len({v["parent"] for v in again}) == 1


def test_without_a_zygote_ranks_start_as_interpreters(monkeypatch: pytest.MonkeyPatch) -> None:
    def cannot_fork(*args: object) -> object:
        raise zygotes.ZygoteError("no zygote in this test")

    monkeypatch.setattr(zygotes.Zygote, "spawn", cannot_fork)
    pool = RankPool(2, "gloo").start()
    try:
        run = pool.run(CheckRequest("checks.ranks.selftest:process"), timeout=30)
        assert run.ok and {v["parent"] for v in run.values()} == {os.getpid()}
    finally:
        pool.close()


def test_the_last_release_without_a_hold_stops_the_zygote(tmp_path: Path) -> None:
    """Outside pytest's session hold (a CLI run): the zygote lives as long as a pool or a manager needs it."""
    script = tmp_path / "standalone.py"
    script.write_text(
        textwrap.dedent("""
        import psutil
        from checks.ranks.manager import PoolManager
        from checks.ranks.protocol import CheckRequest
        m = PoolManager(backend="gloo")
        assert m.run(CheckRequest("checks.ranks.selftest:identify")).ok
        alive = [p for p in psutil.Process().children() if "checks.ranks.zygote" in " ".join(p.cmdline())]
        assert len(alive) == 1, alive
        m.close()
        alive[0].wait(timeout=10)
        assert not psutil.Process().children(), psutil.Process().children()
        print("stopped")
        """)
    )
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, str(script)], check=False, capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0 and done.stdout.strip() == "stopped", done.stderr[-2000:]


def test_a_preloaded_module_is_imported_before_the_fork(
    manager: PoolManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "preloaded_for_ranks.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # the zygote's own path: it started with this test's environment
    monkeypatch.setenv("ZYGOTE_TEST_PRELOAD", "own zygote")  # one started after the module exists
    with zygotes.preloading("preloaded_for_ranks"):
        other = PoolManager(backend="gloo", timeout=30)
        try:
            values = process(other, module="preloaded_for_ranks")
        finally:
            other.close()
    assert all(v["imported_before"] and v["module_found"] for v in values)
    assert not any(v["imported_before"] for v in process(manager, module="json_not_preloaded_here"))


def test_a_preload_that_starts_a_thread_makes_the_ranks_start_as_interpreters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "threaded_for_ranks.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ZYGOTE_TEST_PRELOAD", "threaded")
    with zygotes.preloading("threaded_for_ranks"):
        other = PoolManager(backend="gloo", timeout=30)
        try:
            values = process(other)
        finally:
            other.close()
        assert zygotes._REGISTRY.preloads == ()  # the next zygote would refuse too
    assert all(v["parent"] == os.getpid() for v in values)  # interpreters of this process, not forks
