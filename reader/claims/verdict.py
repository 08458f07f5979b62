"""A claim's verdict: the one place where a claim is run and judged, for every front end.

`decide` takes a claim from its guide to its verdict, one way: torch version (skipped?), request
(`reader.claims.request`: blocked by anchors that do not resolve?), run (`reader.claims.properties`: once, or
over drawn examples), then judgement: skipped in the ranks, failed, failed as its xfail expects, passed without
runtime evidence (`reader.claims.evidence`), or passed; with its failure text in the words of
`reader.claims.text`. pytest's claim and predict items, ``fsdp-readings check`` / ``predict`` / ``exercise`` /
``timeline`` / ``memory`` / ``layout`` all call `decide`, and only it.

A claim passes only if its check passed on every rank and some anchored torch code ran there (runtime evidence).
A claim with ``xfail`` inverts the first half: it holds while its check fails with the one reason it names
(``fails_with``), through anchored code; any other failure fails it, and so does a pass when it is strict.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from checks.ranks.protocol import CheckRun, Patch
from reader.claims.evidence import missing_evidence
from reader.claims.properties import ClaimRun, run_claim
from reader.claims.request import RankPoolUnavailable, Send, UnresolvedAnchors, traced_request
from reader.claims.text import blocked_claim, claim_header
from reader.format.guide import VIEWS, ClaimSpec, ExpectedFailure, Guide

if TYPE_CHECKING:
    from reader.gate.workspace import Workspace


class Status(Enum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    XFAILED = "xfailed"  # an xfail claim whose check failed as expected
    XPASSED = "xpassed"  # a non-strict xfail claim whose check passed


@dataclass(frozen=True)
class ClaimVerdict:
    """What one run of a claim found: its outcome (None when it could not run), why it failed, or why skipped.
    Kept per session, so a predict question reads the run of its claim instead of running it again."""

    outcome: CheckRun | None
    failure: str | None = None
    skipped: str | None = None
    expected: str | None = None  # set for XFAILED / XPASSED: what the xfail says, for the report
    reason: str | None = None  # a failure the verdict itself found (no-runtime-evidence, views-differ), for reports

    @property
    def status(self) -> Status:
        if self.skipped:
            return Status.SKIPPED
        if self.failure:
            return Status.FAILED
        if self.expected is None:
            return Status.PASSED
        return Status.XPASSED if self.outcome is not None and self.outcome.ok else Status.XFAILED


def decide(
    workspace: Workspace,
    guide: Guide,
    claim: ClaimSpec,
    send: Send,
    *,
    display: Callable[[Path], str] = str,
    patches: tuple[Patch, ...] = (),
    overrides: Mapping[str, Any] | None = None,
) -> ClaimVerdict:
    """Run ``claim`` through ``send`` and judge it. ``display`` says how the guide's path appears in the failure
    text; ``patches`` are break-it patches applied in the ranks; ``overrides`` replace some of the claim's kwargs
    (``timeline --compare``)."""
    guide = guide.on(workspace.torch_version)  # anchors and expect blocks of other releases left out
    where = f"{display(guide.path)}:{claim.line}"
    skip = version_skip(claim, workspace.torch_version) or gpu_skip(claim)
    if skip is not None:
        return ClaimVerdict(None, skipped=skip)
    try:
        request, resolutions = traced_request(workspace, guide, claim, patches=patches, **(overrides or {}))
    except UnresolvedAnchors as exc:
        return ClaimVerdict(None, blocked_claim(where, display(guide.path), guide, claim, exc.failed))
    try:
        run = run_claim(claim, request, send)
    except RankPoolUnavailable as exc:
        return ClaimVerdict(None, claim_header(where, claim, "cannot run") + f"\n{exc}")
    return with_example(judge(run.outcome, where, guide, claim, resolutions), run)


def version_skip(claim: ClaimSpec, torch_version: str | None) -> str | None:
    """Why ``claim`` does not run on this torch (its own ``torch`` specifier), or None."""
    if claim.applies_to(torch_version):
        return None
    return f"claim `{claim.id}` describes torch {claim.torch}; this torch is {torch_version}"


def gpu_skip(claim: ClaimSpec) -> str | None:
    """Why a claim marked ``gpu`` does not run here (not one CUDA device per rank), in pytest's words, or None."""
    if "gpu" not in claim.markers:
        return None
    from checks.ranks.backend import missing_gpus  # asks torch for its devices: only for gpu claims

    missing = missing_gpus(claim.world_size)
    return f"claim `{claim.id}` {missing}" if missing else None


def with_example(verdict: ClaimVerdict, run: ClaimRun) -> ClaimVerdict:
    """A falsified property's verdict names the shrunk example it failed on."""
    if run.example is None or not verdict.failure:
        return verdict
    return replace(verdict, failure=f"{verdict.failure}\n{run.falsifying()}")


def fails_as_expected(xfail: ExpectedFailure, outcome: CheckRun) -> bool:
    """The check failed, on its own terms (a `Violation`), with the reason the xfail names."""
    return not outcome.ok and outcome.reason == xfail.fails_with


def describe_xfail(xfail: ExpectedFailure) -> str:
    return f"{xfail.reason} ({xfail.issue})"


def judge(outcome: CheckRun, where: str, guide: Guide, claim: ClaimSpec, resolutions: Any) -> ClaimVerdict:
    """The verdict on a finished run: skipped, failed (with the report), no runtime evidence, or passed."""
    if outcome.skipped:
        return ClaimVerdict(outcome, skipped=outcome.skipped)
    if claim.xfail is not None:
        return _judge_expected_failure(outcome, where, guide, claim, resolutions)
    if not outcome.ok:
        report = outcome.failure or "the check failed without a report"
        return ClaimVerdict(outcome, claim_header(where, claim, "failed") + "\n" + report)
    missing = missing_evidence(claim, guide, resolutions, frozenset(outcome.executed or ()))
    if missing:
        return ClaimVerdict(outcome, claim_header(where, claim, "failed") + "\n" + missing, reason=NO_EVIDENCE)
    return _judge_views(outcome, where, claim)


NO_EVIDENCE = "no-runtime-evidence"
VIEWS_DIFFER = "views-differ"


def supported_views(outcome: CheckRun) -> tuple[str, ...]:
    """What ``fsdp-readings`` can draw from a passing run: ``timeline`` when a rank finished a probe recording,
    ``memory`` when rank 0 returned a memory series, ``layout`` when it returned a flat parameter's layout."""
    value = outcome.values()[0] if outcome.results else None
    recorded = any(r.recorded for r in outcome.results)
    found = {"timeline": recorded}
    found["memory"] = isinstance(value, dict) and bool(value.get("series"))
    found["layout"] = isinstance(value, dict) and bool(value.get("layout"))
    return tuple(view for view in VIEWS if found[view])


def _judge_views(outcome: CheckRun, where: str, claim: ClaimSpec) -> ClaimVerdict:
    """A passing claim declares exactly the views its run supports: the guide's ``views`` is what `show` offers
    and what the views accept, so it must not say more or less than the run can draw."""
    supported = supported_views(outcome)
    if supported == claim.views:
        return ClaimVerdict(outcome)
    shown = ", ".join(f'"{v}"' for v in supported)
    why = (
        f"  the claim declares views = [{', '.join(repr(v) for v in claim.views)}], but its run supports "
        f"[{', '.join(supported) or 'none'}]: a view the run cannot draw would be offered, or one it can would be "
        f"refused\n  fix: write `views = [{shown}]` in the claim's table"
    )
    return ClaimVerdict(outcome, claim_header(where, claim, "failed") + "\n" + why, reason=VIEWS_DIFFER)


def _judge_expected_failure(
    outcome: CheckRun, where: str, guide: Guide, claim: ClaimSpec, resolutions: Any
) -> ClaimVerdict:
    xfail = claim.xfail
    assert xfail is not None
    expected = describe_xfail(xfail)
    if not outcome.ok and not fails_as_expected(xfail, outcome):
        got = f"`{outcome.reason}`" if outcome.reason else ", ".join(sorted(outcome.error_types)) or "an error"
        head = claim_header(where, claim, "failed, but not as its xfail expects")
        why = f"  expected to fail with `{xfail.fails_with}`: {expected}\n  failed with {got} instead"
        return ClaimVerdict(outcome, f"{head}\n{why}\n{outcome.failure or ''}".rstrip())
    # Failing as expected counts only if it failed inside the code the guide reads, not before reaching it.
    missing = missing_evidence(claim, guide, resolutions, frozenset(outcome.executed or ()))
    if missing:
        return ClaimVerdict(outcome, claim_header(where, claim, "failed") + "\n" + missing, reason=NO_EVIDENCE)
    if not outcome.ok and fails_as_expected(xfail, outcome):
        return ClaimVerdict(outcome, expected=expected)
    if xfail.strict:
        head = claim_header(where, claim, "passed unexpectedly (strict xfail)")
        why = (
            f"  it was expected to fail with `{xfail.fails_with}`: {expected}\n"
            "  torch may have fixed it: re-read the guide against this torch, then remove the claim's `xfail`"
        )
        return ClaimVerdict(outcome, f"{head}\n{why}")
    return ClaimVerdict(outcome, expected=expected)


def failure_summary(verdict: ClaimVerdict) -> tuple[str, str]:
    """A failed claim in one line for a report: its reason (the `Violation`'s, ``no-runtime-evidence`` when the
    check passed without running the anchored code, else the exception type) and the first line of what it
    found."""
    outcome = verdict.outcome
    if verdict.reason is not None:
        reason = verdict.reason
    elif outcome is None:
        reason = "not-run"
    elif outcome.ok:
        reason = NO_EVIDENCE
    else:
        reason = outcome.reason or ", ".join(sorted(outcome.error_types)) or "error"
    failed = outcome.failed if outcome is not None else []
    found = next((r for r in failed if r.message), None)
    if found is not None:  # what the check itself said, on the lowest rank that said it
        return reason, f"rank {found.rank}: {found.message}"[:300]
    lines = (verdict.failure or "").split("\n")
    header = ("statement:", "check:")  # `claim_header`'s own lines: the report has them elsewhere
    first = next((line.strip() for line in lines[1:] if line.strip() and not line.strip().startswith(header)), "")
    return reason, first[:300]


def observed_run(verdict: ClaimVerdict) -> Any:
    """What a predict question reads from a run: rank 0's return value; for a claim failing as its xfail
    expects, the details of the `Violation` it failed with (the check's account of what torch did instead)."""
    assert verdict.outcome is not None
    if verdict.status is Status.XFAILED:
        return verdict.outcome.details
    return verdict.outcome.values()[0]
