"""A claim's views: what its run can draw (``views = [...]`` in its table), kept true by every run of it, offered
by ``show`` as commands and refused at once by the views it does not have."""

from __future__ import annotations

from pathlib import Path

import pytest

from checks.ranks.protocol import CheckRequest, CheckRun, RankResult
from reader.claims.status import Status
from reader.claims.verdict import VIEWS_DIFFER, judge, supported_views
from reader.format.errors import GuideError
from reader.format.guide import ClaimSpec
from reader.format.parse import parse_guide
from reader.views.guide import view_commands
from tests.reader.reader_support import PREFETCH_ANCHOR, guide

CLAIM = """
[[claims]]
id = "draws"
statement = "It prefetches in order."
check = "checks.guides.g04_forward_prefetch:follows_iteration_1_order"
world_size = 2
{views}
"""


def _claim(views: str, tmp_path: Path) -> tuple[object, ClaimSpec]:
    parsed = parse_guide(guide(anchors=PREFETCH_ANCHOR, claims=CLAIM.format(views=views)), tmp_path / "g.md")
    return parsed, parsed.claims[0]


def _run(value: object, recorded: frozenset[str] = frozenset()) -> CheckRun:
    trace = "torch.distributed.fsdp._runtime_utils:_prefetch_handle"
    results = [RankResult(r, ok=True, value=value, executed=frozenset({trace}), recorded=recorded) for r in (0, 1)]
    return CheckRun(CheckRequest("x:y"), results)


def test_views_are_read_in_one_order_and_mistakes_are_named(tmp_path: Path) -> None:
    _, claim = _claim('views = ["memory", "timeline"]', tmp_path)
    assert claim.views == ("timeline", "memory")
    _, claim = _claim("", tmp_path)
    assert claim.views == ()
    with pytest.raises(GuideError, match=r"`views`: unknown view\(s\) movie"):
        _claim('views = ["movie"]', tmp_path)
    with pytest.raises(GuideError, match="`views`: a view named twice"):
        _claim('views = ["memory", "memory"]', tmp_path)


def test_what_a_run_supports() -> None:
    assert supported_views(_run({"order": [1]})) == ()
    assert supported_views(_run({"order": [1]}, frozenset({"events"}))) == ("timeline",)
    assert supported_views(_run({"series": {"a": [("m", {"params": 4})]}}, frozenset({"comm"}))) == (
        "timeline",
        "memory",
    )
    assert supported_views(_run({"layout": {"ranks": 2}})) == ("layout",)


def test_a_claim_whose_views_are_not_its_runs_fails_and_says_what_to_write(tmp_path: Path) -> None:
    parsed, declares_none = _claim("", tmp_path)
    drawn = _run({"order": [1]}, frozenset({"events"}))
    verdict = judge(drawn, "g.md:9", parsed, declares_none, _resolved(parsed))
    assert verdict.status is Status.FAILED and verdict.reason == VIEWS_DIFFER
    assert 'fix: write `views = ["timeline"]`' in (verdict.failure or "")
    _, declares_memory = _claim('views = ["timeline", "memory"]', tmp_path)
    verdict = judge(drawn, "g.md:9", parsed, declares_memory, _resolved(parsed))
    assert verdict.status is Status.FAILED and "but its run supports [timeline]" in (verdict.failure or "")
    _, declares_timeline = _claim('views = ["timeline"]', tmp_path)
    assert judge(drawn, "g.md:9", parsed, declares_timeline, _resolved(parsed)).status is Status.PASSED


def _resolved(parsed: object) -> dict[str, object]:
    class Traceable:
        traceable = True

    return {"prefetch": Traceable()}


def test_show_offers_each_view_and_exercise_as_a_command(tmp_path: Path) -> None:
    parsed, claim = _claim('views = ["timeline", "memory"]', tmp_path)
    assert view_commands(parsed, claim, {"draws": ["two-ahead"]}) == [
        "fsdp-readings timeline 04-forward-prefetch draws",
        "fsdp-readings memory 04-forward-prefetch draws",
        "fsdp-readings exercise 04-forward-prefetch two-ahead",
    ]
