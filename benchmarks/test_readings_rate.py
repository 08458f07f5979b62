"""How fast ``pytest readings/`` proves claims, and where its time goes.

- `test_claims_per_second`: every claim its items run by default (not slow, not GPU-only, for this torch), through
  the same request path (`reader.claims.request.traced_request`, `reader.claims.properties.run_claim`), on pools
  already started for 2 and 4 ranks.
- `test_phase_table`: the run's phases one after another, each timed on its own: parsing the guides, the anchor
  items' drift checks, starting the zygote and pools from it (and, for comparison, a pool whose ranks import torch
  themselves), every claim by guide with runtime evidence and again without it (their difference is what the
  evidence costs). Break-it tests are not here: they are tests, timed by pytest (``--durations``).

    pytest benchmarks/test_readings_rate.py

``extra_info`` holds the figures (listed under the table by `benchmarks/conftest.py`, the phases as a table of
their own); compare rows of one run, not numbers in prose.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from checks.ranks import zygote as zygotes
from checks.ranks.manager import PoolManager
from checks.ranks.pool import RankPool
from checks.ranks.protocol import CheckRequest, CheckRun
from reader.claims.properties import run_claim
from reader.claims.request import traced_request
from reader.claims.verdict import fails_as_expected, version_skip
from reader.format.guide import ClaimSpec, Guide
from reader.format.parse import load_all
from reader.gate.workspace import LOCK_NAME, Workspace
from reader.source.checkref import CheckFinder
from reader.source.torch_source import open_source

READINGS = Path(__file__).resolve().parents[1] / "readings"


def _guides() -> list[Guide]:
    """The guides as read on the installed torch (an expect block written per torch range resolves to its
    release's), as their items read them."""
    import torch

    guides, broken = load_all([READINGS], CheckFinder(extra_paths=[READINGS.parent]))
    assert not broken, broken
    return [guide.on(torch.__version__) for guide in guides]


def _claims(workspace: Workspace, guides: list[Guide]) -> list[tuple[Guide, ClaimSpec, CheckRequest]]:
    """Every claim ``pytest readings/`` runs here by default: not slow, not GPU-only, for this torch."""
    return [
        (guide, claim, traced_request(workspace, guide, claim)[0])
        for guide in guides
        for claim in guide.claims
        if not {"slow", "gpu"} & set(claim.markers) and version_skip(claim, workspace.torch_version) is None
    ]


def _holds(claim: ClaimSpec, run: CheckRun) -> bool:
    """The verdict's first half: the check passed, or failed exactly as the claim's xfail expects."""
    return fails_as_expected(claim.xfail, run) if claim.xfail is not None else run.ok


@pytest.mark.benchmark(group="readings-rate")
def test_claims_per_second(benchmark, warm_pool: PoolManager) -> None:
    claims = _claims(Workspace(open_source(None), READINGS / LOCK_NAME), _guides())

    def run_all() -> int:  # a property claim is all of its drawn examples, as its item runs it
        return sum(_holds(claim, run_claim(claim, request, warm_pool.run).outcome) for _, claim, request in claims)

    held = benchmark.pedantic(run_all, rounds=1, warmup_rounds=0)
    assert held == len(claims)
    seconds = benchmark.stats.stats.mean
    benchmark.extra_info["claims"] = len(claims)
    benchmark.extra_info["claims_per_second"] = round(len(claims) / seconds, 2)
    benchmark.extra_info["seconds_per_claim"] = round(seconds / len(claims), 3)


class _Clock:
    """Seconds by phase, in the order measured."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}

    def time(self, phase: str, work: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        value = work()
        self.phases[phase] = self.phases.get(phase, 0.0) + time.perf_counter() - started
        return value


@pytest.fixture
def fresh_zygote() -> Iterator[None]:
    """No zygote left from an earlier benchmark: the table times starting one."""
    zygotes.close_all()
    yield
    zygotes.close_all()


def _pool_start(world_size: int, *, zygote: bool) -> Callable[[], None]:
    def start() -> None:
        pool = RankPool(world_size, "gloo")
        if not zygote:
            pool_start_without_zygote(pool)
        else:
            pool.start()
        assert pool.run(CheckRequest("checks.ranks.selftest:trivial", world_size=world_size), 60).ok
        pool.close()

    return start


def pool_start_without_zygote(pool: RankPool) -> None:
    """Start ``pool`` the way it starts when no zygote can fork: every rank an interpreter importing torch."""
    original = zygotes.Zygote.spawn

    def refuse(self: zygotes.Zygote, *args: Any) -> Any:
        raise zygotes.ZygoteError("measuring ranks without a zygote")

    zygotes.Zygote.spawn = refuse  # type: ignore[method-assign]
    try:
        pool.start()
    finally:
        zygotes.Zygote.spawn = original  # type: ignore[method-assign]


@pytest.mark.benchmark(group="readings-phases")
def test_phase_table(benchmark, fresh_zygote: None) -> None:
    def measure() -> dict[str, float]:
        clock = _Clock()
        guides = clock.time("parse the guides", _guides)
        workspace = Workspace(open_source(None), READINGS / LOCK_NAME)
        for guide in guides:
            for anchor in guide.anchors:
                if anchor.applies_to(workspace.torch_version):
                    clock.time("anchors (drift of each)", lambda g=guide, a=anchor: workspace.drift(g, a))
        claims = clock.time("claim requests (trace symbols)", lambda: _claims(workspace, guides))
        manager = PoolManager(backend="gloo", timeout=120)
        try:
            manager.prestart()  # returns at once: the zygote imports while the first pool waits for it
            clock.time("pool start: 2 ranks, zygote importing", _pool_start(2, zygote=True))
            clock.time("pool start: 2 ranks from the zygote", _pool_start(2, zygote=True))
            clock.time("pool start: 4 ranks from the zygote", _pool_start(4, zygote=True))
            clock.time("pool start: 2 ranks as interpreters", _pool_start(2, zygote=False))
            for world_size in (2, 3, 4):  # the sizes the claims use, started before the claims are timed
                assert manager.run(CheckRequest("checks.ranks.selftest:trivial", world_size=world_size)).ok
            for guide, claim, request in claims:
                held = clock.time(f"claims {guide.id[:2]}", lambda c=claim, r=request: _run(c, r, manager))
                assert held, f"{guide.id}::{claim.id}"
            for _, claim, request in claims:
                untraced = dataclasses.replace(request, trace=())
                clock.time("claims without evidence", lambda c=claim, r=untraced: _run(c, r, manager))
        finally:
            manager.close()
        by_guide = [phase for phase in clock.phases if phase.startswith("claims ") and phase[7:9].isdigit()]
        traced = sum(clock.phases[phase] for phase in by_guide)
        clock.phases["claims with evidence"] = traced
        clock.phases["runtime evidence (difference)"] = traced - clock.phases["claims without evidence"]
        return {phase: round(seconds, 2) for phase, seconds in clock.phases.items()}

    phases = benchmark.pedantic(measure, rounds=1, warmup_rounds=0)
    benchmark.extra_info["phases"] = phases


def _run(claim: ClaimSpec, request: CheckRequest, manager: PoolManager) -> bool:
    return _holds(claim, run_claim(claim, request, manager.run).outcome)
