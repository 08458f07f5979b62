"""The rank pool's pytest face: options, environment variables, and GPU checks skipped with their reason."""

from __future__ import annotations

import pytest

from checks.ranks import backend as backends
from checks.ranks.manager import PoolManager
from checks.ranks.protocol import CheckRequest

pytest_plugins = ["pytester"]

GPU_TEST = """
import pytest

@pytest.mark.gpu
@pytest.mark.world_size(2)
def test_needs_two_gpus(pool):
    assert pool.run is not None
"""


@pytest.mark.skipif(backends.cuda_device_count() >= 2, reason="this machine has the GPUs: nothing to skip")
def test_gpu_marked_items_skip_with_their_reason(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["checks.ranks.pytest_plugin"]')
    pytester.makepyfile(GPU_TEST)
    result = pytester.runpytest("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs 2 CUDA device(s) for nccl (one per rank); * here*"])


@pytest.mark.skipif(backends.cuda_device_count() >= 2, reason="this machine has the GPUs: nothing to skip")
def test_nccl_without_gpus_skips_the_check_with_its_reason() -> None:
    run = PoolManager(backend="nccl").run(CheckRequest("checks.ranks.selftest:trivial", world_size=2))
    assert not run.ok and run.results == []
    assert (
        run.skipped
        == f"nccl needs one CUDA device per rank: 2 ranks, {backends.cuda_device_count()} CUDA device(s) here"
    )


def test_options_and_environment_reach_the_manager(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest('pytest_plugins = ["checks.ranks.pytest_plugin"]')
    pytester.makepyfile(
        """
        def test_settings(pool, world_size):
            assert (world_size, pool.default_world_size) == (4, 4)
            assert (pool.requested_backend, pool.mode, pool.timeout) == ("gloo", "fresh", 12.5)
        """
    )
    monkeypatch.setenv("FSDP_READINGS_WORLD_SIZE", "4")
    monkeypatch.setenv("FSDP_READINGS_POOL_MODE", "fresh")
    result = pytester.runpytest("--backend=gloo", "--check-timeout=12.5", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_bad_options_are_usage_errors(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["checks.ranks.pytest_plugin"]')
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest("--world-size=0", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--world-size must be at least 1*"])
    result = pytester.runpytest("--backend=mpi", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
