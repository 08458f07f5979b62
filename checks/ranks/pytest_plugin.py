"""pytest options and fixtures for running checks on ranks: ``--world-size``, ``--backend``, ``--pool-mode``,
``--check-timeout``; the session's `PoolManager` behind `pool_manager(config)` and the ``pool`` fixture."""

from __future__ import annotations

import os

import pytest

from checks.ranks import backend as backends
from checks.ranks import zygote as zygotes
from checks.ranks.manager import DEFAULT_TIMEOUT, MODES, PoolManager

_MANAGER = pytest.StashKey[PoolManager]()
ENV_PREFIX = "FSDP_READINGS_"


def _env(name: str, default: str) -> str:
    return os.environ.get(ENV_PREFIX + name, default)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fsdp-readings ranks")
    group.addoption(
        "--world-size", type=int, default=int(_env("WORLD_SIZE", "2")),
        help="ranks for checks that do not fix their own world size (env FSDP_READINGS_WORLD_SIZE; default 2)",
    )  # fmt: skip
    group.addoption(
        "--backend", choices=backends.BACKENDS, default=_env("BACKEND", "auto"),
        help="auto: nccl with one CUDA device per rank, else gloo on CPU (env FSDP_READINGS_BACKEND)",
    )  # fmt: skip
    group.addoption(
        "--pool-mode", choices=MODES, default=_env("POOL_MODE", "auto"),
        help="persistent ranks reused by every check (default), fresh ranks per check, or torchrun "
        "(auto when RANK/WORLD_SIZE are set) (env FSDP_READINGS_POOL_MODE)",
    )  # fmt: skip
    group.addoption(
        "--check-timeout", type=float, default=float(_env("CHECK_TIMEOUT", str(DEFAULT_TIMEOUT))),
        help="seconds before a check's ranks are stopped and their stacks reported (default 60)",
    )  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--world-size") < 1:
        raise pytest.UsageError("--world-size must be at least 1")
    zygotes.hold()  # pools of this session's managers, and of tests' own, fork from one zygote


def pool_manager(config: pytest.Config) -> PoolManager:
    """The session's manager, created on first use so a run that checks nothing spawns nothing."""
    manager = config.stash.get(_MANAGER, None)
    if manager is None:
        manager = PoolManager(
            backend=config.getoption("--backend"),
            mode=config.getoption("--pool-mode"),
            timeout=config.getoption("--check-timeout"),
            default_world_size=config.getoption("--world-size"),
        )
        config.stash[_MANAGER] = manager
    return manager


@pytest.fixture(scope="session")
def pool(pytestconfig: pytest.Config) -> PoolManager:
    return pool_manager(pytestconfig)


@pytest.fixture(scope="session")
def world_size(pytestconfig: pytest.Config) -> int:
    return pytestconfig.getoption("--world-size")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is None:
        return
    marker = item.get_closest_marker("world_size")
    needed = marker.args[0] if marker and marker.args else item.config.getoption("--world-size")
    missing = backends.missing_gpus(needed)
    if missing is not None:
        pytest.skip(missing)


def pytest_collection_finish(session: pytest.Session) -> None:
    """When something collected runs on ranks (a claim item, a test using the ``pool`` fixture), start the zygote
    now: its imports overlap the items that come first."""

    def on_ranks(item: pytest.Item) -> bool:
        return getattr(item, "runs_on_ranks", False) or "pool" in getattr(item, "fixturenames", ())

    if any(on_ranks(item) for item in session.items):
        pool_manager(session.config).prestart()


def pytest_unconfigure(config: pytest.Config) -> None:
    manager = config.stash.get(_MANAGER, None)
    if manager is not None:
        manager.close()
    zygotes.unhold()
