"""How fast ``pytest readings/`` proves claims on a warm pool: every claim of every guide that its items run
by default (not slow, not GPU-only, for this torch), through the same request path
(`reader.claims.request.traced_request`, `reader.claims.properties.run_claim`), on pools already started for 2 and
4 ranks.

    pytest benchmarks/test_readings_rate.py

``extra_info`` holds the claim count, claims per second and seconds per claim (listed under the table by
`benchmarks/conftest.py`); compare rows of one run, not numbers in prose.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from checks.ranks.manager import PoolManager
from checks.ranks.protocol import CheckRequest, CheckRun
from reader.claims.properties import run_claim
from reader.claims.request import traced_request
from reader.claims.verdict import fails_as_expected, version_skip
from reader.format.guide import ClaimSpec
from reader.format.parse import load_all
from reader.gate.workspace import LOCK_NAME, Workspace
from reader.source.checkref import CheckFinder
from reader.source.torch_source import open_source

READINGS = Path(__file__).resolve().parents[1] / "readings"


def _claims() -> list[tuple[ClaimSpec, CheckRequest]]:
    """Every claim ``pytest readings/`` runs here by default: not slow, not GPU-only, for this torch."""
    guides, broken = load_all([READINGS], CheckFinder(extra_paths=[READINGS.parent]))
    assert not broken, broken
    workspace = Workspace(open_source(None), READINGS / LOCK_NAME)
    return [
        (claim, traced_request(workspace, guide, claim)[0])
        for guide in guides
        for claim in guide.claims
        if not {"slow", "gpu"} & set(claim.markers) and version_skip(claim, workspace.torch_version) is None
    ]


def _holds(claim: ClaimSpec, run: CheckRun) -> bool:
    """The verdict's first half: the check passed, or failed exactly as the claim's xfail expects."""
    return fails_as_expected(claim.xfail, run) if claim.xfail is not None else run.ok


@pytest.mark.benchmark(group="readings-rate")
def test_claims_per_second(benchmark, warm_pool: PoolManager) -> None:
    claims = _claims()

    def run_all() -> int:  # a property claim is all of its drawn examples, as its item runs it
        return sum(_holds(claim, run_claim(claim, request, warm_pool.run).outcome) for claim, request in claims)

    held = benchmark.pedantic(run_all, rounds=1, warmup_rounds=0)
    assert held == len(claims)
    seconds = benchmark.stats.stats.mean
    benchmark.extra_info["claims"] = len(claims)
    benchmark.extra_info["claims_per_second"] = round(len(claims) / seconds, 2)
    benchmark.extra_info["seconds_per_claim"] = round(seconds / len(claims), 3)
