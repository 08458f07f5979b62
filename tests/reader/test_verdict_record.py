"""A claim's verdict is the record every view reads: its status, reason, one-line summary and measured values are
set where `reader.claims.verdict` decides the failure, and the report's row, approval, the progress file and the
pictures are read off it, never off a failure's text or pytest's outcome.

Runs are built by hand here (`CheckRun` of `RankResult`s), so each way a claim can end is judged on purpose; the
expected reason and summary come from what each rank was made to say, not from the verdict."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from checks.ranks.protocol import CheckRequest, CheckRun, RankResult
from reader.claims.pictures import Pictures
from reader.claims.progress import Progress
from reader.claims.records import record_verdicts
from reader.claims.status import Status, tally
from reader.claims.verdict import NO_EVIDENCE, PASSED_UNEXPECTEDLY, ClaimVerdict, judge
from reader.format.guide import ClaimSpec, Guide
from reader.format.parse import parse_guide
from reader.gate.approval import sort_claims
from reader.gate.report import ClaimRow
from tests.reader.reader_support import PREFETCH_ANCHOR, guide

TRACED = "torch.distributed.fsdp._runtime_utils:_prefetch_handle"
CLAIM = """
[[claims]]
id = "order"
statement = "It prefetches in order."
check = "checks.guides.g04_forward_prefetch:follows_iteration_1_order"
world_size = 2
{xfail}
"""
XFAIL = 'xfail = {{ strict = {strict}, reason = "upstream", issue = "https://x/1", fails_with = "bad-order" }}'


def _guide(tmp_path: Path, xfail: str = "") -> tuple[Guide, ClaimSpec]:
    parsed = parse_guide(guide(anchors=PREFETCH_ANCHOR, claims=CLAIM.format(xfail=xfail)), tmp_path / "g.md")
    return parsed, parsed.claims[0]


def _passed(value: object, ran: bool = True) -> CheckRun:
    executed = frozenset({TRACED}) if ran else frozenset()
    return CheckRun(CheckRequest("x:y"), [RankResult(r, ok=True, value={"rank": r, **value}, executed=executed)  # type: ignore[dict-item]
                                          for r in (0, 1)])  # fmt: skip


def _violated(reason: str = "bad-order") -> CheckRun:
    """Rank 0 passes; rank 1 finds the claim false with a `Violation` (its reason, message and details)."""
    found = RankResult(1, ok=False, error_type="checks.violation.Violation", message="order was [2, 1]",
                       reason=reason, details={"order": [2, 1]}, executed=frozenset({TRACED}))  # fmt: skip
    return CheckRun(CheckRequest("x:y"), [RankResult(0, ok=True, value={}, executed=frozenset({TRACED})), found],
                    failure="rank 1: Violation: order was [2, 1]")  # fmt: skip


def _resolved() -> dict[str, object]:
    return {"prefetch": SimpleNamespace(traceable=True)}


def test_each_ending_is_recorded_where_it_is_decided(tmp_path: Path) -> None:
    parsed, claim = _guide(tmp_path)
    held = judge(_passed({"order": [1, 2]}), "g.md:9", parsed, claim, _resolved())
    assert (held.status, held.reason, held.summary, held.measured) == (
        Status.PASSED,
        None,
        "",
        {"rank": 0, "order": [1, 2]},
    )
    failed = judge(_violated(), "g.md:9", parsed, claim, _resolved())
    assert (failed.status, failed.reason, failed.summary) == (Status.FAILED, "bad-order", "rank 1: order was [2, 1]")
    assert failed.measured == {"order": [2, 1]}  # what the check found torch did instead
    assert failed.failure is not None and failed.failure.startswith("g.md:9: claim `order` failed")
    unproven = judge(_passed({}, ran=False), "g.md:9", parsed, claim, _resolved())
    assert (unproven.status, unproven.reason) == (Status.FAILED, NO_EVIDENCE)
    assert unproven.summary.startswith("this check never ran the code its guide reads")


def test_an_xfail_records_what_it_expects_and_a_strict_one_that_passes_says_so(tmp_path: Path) -> None:
    parsed, strict = _guide(tmp_path, XFAIL.format(strict="true"))
    known = judge(_violated(), "g.md:9", parsed, strict, _resolved())
    assert (known.status, known.summary, known.measured) == (
        Status.XFAILED,
        "upstream (https://x/1)",
        {"order": [2, 1]},
    )
    fixed = judge(_passed({}), "g.md:9", parsed, strict, _resolved())
    # Before, the report called this `no-runtime-evidence`: its reason was guessed from the run after the fact.
    assert (fixed.status, fixed.reason) == (Status.FAILED, PASSED_UNEXPECTEDLY)
    assert fixed.summary.startswith("it was expected to fail with `bad-order`")
    other = judge(_violated("other-reason"), "g.md:9", parsed, strict, _resolved())
    assert (other.status, other.reason, other.summary) == (Status.FAILED, "other-reason", "rank 1: order was [2, 1]")
    _, lenient = _guide(tmp_path, XFAIL.format(strict="false"))
    assert judge(_passed({}), "g.md:9", parsed, lenient, _resolved()).status is Status.XPASSED


def test_the_row_approval_and_progress_read_one_verdict_alike(tmp_path: Path) -> None:
    parsed, claim = _guide(tmp_path)
    failed = judge(_violated(), "g.md:9", parsed, claim, _resolved())
    row = ClaimRow.of(claim, failed)
    assert (row.outcome, row.reason, row.message, row.line, row.ran) == (
        Status.FAILED, "bad-order", "rank 1: order was [2, 1]", claim.line, True)  # fmt: skip
    refused = sort_claims(parsed, {claim.id: failed}, "2.13.0")
    assert refused.failed == ["order"]
    assert refused.reasons == ["claim `order` failed on torch 2.13.0: `bad-order` rank 1: order was [2, 1]"]
    scores, drawn = Progress(tmp_path / "progress.json"), Pictures(tmp_path / "pictures.json")
    record_verdicts([(parsed.id, claim, failed)], "2.13.0", scores, drawn)
    assert scores.claims(parsed.id, "2.13.0") == {"order": Status.FAILED}
    skipped = ClaimVerdict.skip("needs 2 CUDA devices")
    assert ClaimRow.of(claim, skipped).message == "needs 2 CUDA devices"
    assert sort_claims(parsed, {claim.id: skipped}, "2.13.0").skipped == ["order"]


def test_a_claim_that_never_reached_its_verdict_is_reported_but_not_recorded(tmp_path: Path) -> None:
    parsed, claim = _guide(tmp_path)
    ended = ClaimVerdict.skip("slow: run with --slow", decided=False)
    scores, drawn = Progress(tmp_path / "progress.json"), Pictures(tmp_path / "pictures.json")
    assert not record_verdicts([(parsed.id, claim, ended)], "2.13.0", scores, drawn)
    assert scores.claims(parsed.id) == {}
    assert ClaimRow.of(claim, ended).outcome is Status.SKIPPED
    blocked = ClaimVerdict.fail(None, "text", reason="not-run", summary="anchor `prefetch` removed")
    assert not ClaimRow.of(claim, blocked).ran  # decided without a run: it did not run


def test_statuses_are_their_stored_text_and_one_rule_counts_what_held() -> None:
    assert [str(s) for s in Status] == ["passed", "failed", "skipped", "xfailed", "xpassed", "approved"]
    assert Status.named("xpassed") is Status.XPASSED and Status.named("flaky") is None
    # `list` and the site counted an xpassed claim as not held while approval held it; one rule now.
    assert tally([Status.PASSED, Status.XFAILED, Status.XPASSED, Status.FAILED, Status.SKIPPED]) == (3, 1)


def test_a_progress_file_with_a_result_this_version_does_not_know_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    path.write_text('{"claims": {"g": {"a": {"result": "passed"}, "b": {"result": "exploded"}}}}')
    assert Progress(path).claims("g") == {"a": Status.PASSED}


@pytest.mark.parametrize("status", [Status.PASSED, Status.XFAILED, Status.XPASSED])
def test_only_a_passing_verdict_leaves_a_picture(tmp_path: Path, status: Status) -> None:
    claim = SimpleNamespace(id="c", views=("memory",))
    series = {"series": {"a": [("m", {"params": 1})]}}
    kept = record_verdicts([("g", claim, ClaimVerdict(status, None, measured=series))], "2.13.0",  # type: ignore[list-item]
                           Progress(tmp_path / "p.json"), Pictures(tmp_path / "pictures.json"))  # fmt: skip
    assert kept is (status is Status.PASSED)
