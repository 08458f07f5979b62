"""Claim items against the real rank pool of ``checks.ranks`` (a subprocess pytest session, real ranks).

Real ranks, the real installed torch, real tracing: a check that calls the anchored torch function passes; one
that does not fails with "this check never ran the code its guide reads".
"""

from __future__ import annotations

import os

import pytest

TARGETS = """
import torch.distributed as dist


def world_size_is(ctx, expected):
    assert dist.get_world_size() == expected
    return dist.get_rank()


def touches_nothing(ctx, expected):
    return expected
"""

GUIDE = """+++
id = "90-pool-integration"
title = "The reader against the real rank pool"
order = 90
torch = ">=2.13"

[[anchors]]
name = "get-world-size"
symbol = "torch.distributed.distributed_c10d:get_world_size"

[[claims]]
id = "runs-the-anchor"
statement = "Every rank sees the world size the claim asks for."
check = "reader_pool_targets:world_size_is"
world_size = 2
kwargs = { expected = 2 }

[[claims]]
id = "never-runs-the-anchor"
statement = "A check that does not call the anchored function proves nothing about it."
check = "reader_pool_targets:touches_nothing"
world_size = 2
kwargs = { expected = 2 }
+++
"""


@pytest.mark.slow
@pytest.mark.world_size(2)
def test_claims_on_real_ranks(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:hypothesispytest\n")
    pytester.makepyfile(reader_pool_targets=TARGETS)
    pytester.syspathinsert()
    # Ranks may be fresh interpreters: make the target module importable there too.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(pytester.path), os.environ.get("PYTHONPATH")])))
    (pytester.path / "readings").mkdir()
    (pytester.path / "readings" / "90-pool-integration.md").write_text(GUIDE)
    result = pytester.runpytest_subprocess(
        "-p", "checks.ranks.pytest_plugin", "-p", "reader.plugin", "readings", "-k", "claim", "-v", timeout=300
    )
    result.stdout.fnmatch_lines(
        [
            "*::claim[[]runs-the-anchor] PASSED*",
            "*::claim[[]never-runs-the-anchor] FAILED*",
            "this check never ran the code its guide reads.",
            "  - get-world-size: torch.distributed.distributed_c10d:get_world_size",
        ]
    )
    assert result.ret == 1
