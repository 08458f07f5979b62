"""A claim's verdict: the one place where a claim is run and judged, for every front end.

`decide` takes a claim from its guide to its verdict, one way: torch version (skipped?), request
(`reader.claims.request`: blocked by anchors that do not resolve?), run (`reader.claims.properties`: once, or
over drawn examples), then judgement: skipped in the ranks, failed, failed as its xfail expects, passed without
runtime evidence (`reader.claims.evidence`), or passed; with its failure text in the words of
`reader.claims.text`. pytest's claim and predict items, ``fsdp-readings check`` / ``predict`` / ``exercise`` /
``timeline`` / ``memory`` / ``layout`` all call `decide`, and only it.

The `ClaimVerdict` it returns is the record every view reads: its `Status`, and the reason, one-line summary and
measured values set here, where each failure is decided. pytest's items keep it, the report's rows
(`reader.gate.report.ClaimRow.of`), approval, the progress file and the site read it; none of them re-reads a
failure's text or pytest's outcome.

A claim passes only if its check passed on every rank and some anchored torch code ran there (runtime evidence).
A claim with ``xfail`` inverts the first half: it holds while its check fails with the one reason it names
(``fails_with``), through anchored code; any other failure fails it, and so does a pass when it is strict.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from checks.ranks.protocol import CheckRun, Patch
from reader.claims.evidence import missing_evidence
from reader.claims.properties import ClaimRun, run_claim
from reader.claims.request import RankPoolUnavailable, Resolving, Send, UnresolvedAnchors, traced_request
from reader.claims.status import Status
from reader.claims.text import blocked_claim, claim_header, unresolved_anchor
from reader.format.guide import VIEWS, ClaimSpec, ExpectedFailure, Guide

NO_EVIDENCE = "no-runtime-evidence"
VIEWS_DIFFER = "views-differ"
PASSED_UNEXPECTEDLY = "passed-unexpectedly"  # a strict xfail claim whose check passed
NOT_RUN = "not-run"  # its anchors do not resolve, or the ranks cannot be reached
SUMMARY_WIDTH = 300  # characters of a summary: one line of a report, never a page


@dataclass(frozen=True)
class ClaimVerdict:
    """What one run of a claim found, as every view reads it: its `Status`, the run (None when it could not run),
    and, set where the verdict is reached, the failure's reason and text, a one-line summary and what the run
    measured. Kept per session, so a predict question reads the run of its claim instead of running it again."""

    status: Status
    outcome: CheckRun | None
    # One line for a report: a failure's finding (``rank 1: ...``), a skip's reason, or what an xfail says.
    summary: str = ""
    reason: str | None = None  # FAILED: the `Violation`'s reason, the exception types, or the verdict's own
    failure: str | None = None  # FAILED: the whole text pytest and ``check`` show (`reader.claims.text`)
    # Rank 0's return value; for a check that failed with a `Violation`, its details (what torch did instead).
    measured: Any = None
    decided: bool = True  # False: pytest ended the item before `decide` (a skip at setup, an error in the reader)

    @property
    def skipped(self) -> str | None:
        """Why the claim did not run here, when it was skipped."""
        return self.summary if self.status is Status.SKIPPED else None

    @property
    def expected(self) -> str | None:
        """What the claim's xfail says, when its xfail decided the verdict (XFAILED / XPASSED)."""
        return self.summary if self.status in (Status.XFAILED, Status.XPASSED) else None

    @classmethod
    def skip(cls, why: str, outcome: CheckRun | None = None, *, decided: bool = True) -> ClaimVerdict:
        return cls(Status.SKIPPED, outcome, why, decided=decided)

    @classmethod
    def fail(
        cls, outcome: CheckRun | None, text: str, *, reason: str | None, summary: str, decided: bool = True
    ) -> ClaimVerdict:
        """A failed claim: ``text`` whole, ``reason`` and ``summary`` as the place that decided it words them."""
        measured = _measured(outcome)
        return cls(Status.FAILED, outcome, summary[:SUMMARY_WIDTH], reason, text, measured, decided)

    @classmethod
    def run_failed(cls, outcome: CheckRun, text: str) -> ClaimVerdict:
        """A claim whose check failed (or raised): the reason and summary are the check's own, from its ranks."""
        return cls.fail(outcome, text, reason=check_reason(outcome), summary=finding(outcome))


def first_line(text: str) -> str:
    """The first line of ``text`` that says something."""
    return next((line.strip() for line in text.split("\n") if line.strip()), "")


def _measured(outcome: CheckRun | None) -> Any:
    if outcome is None:
        return None
    if outcome.ok:
        return outcome.values()[0] if outcome.results else None
    return outcome.details if outcome.reason is not None else None


def check_reason(outcome: CheckRun) -> str:
    """Why a check failed, as a report's reason: its `Violation`'s reason, else the exception types its ranks
    raised."""
    return outcome.reason or ", ".join(sorted(outcome.error_types)) or "error"


def finding(outcome: CheckRun) -> str:
    """What a failed check said, on the lowest rank that said something, else the first line of its report."""
    said = next((r for r in outcome.failed if r.message), None)
    if said is not None:
        return f"rank {said.rank}: {said.message}"
    return first_line(outcome.failure or "the check failed without a report")


def decide(
    workspace: Resolving,
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
        return ClaimVerdict.skip(skip)
    try:
        request, resolutions = traced_request(workspace, guide, claim, patches=patches, **(overrides or {}))
    except UnresolvedAnchors as exc:
        text = blocked_claim(where, display(guide.path), guide, claim, exc.failed)
        name, error = next(iter(exc.failed.items()))
        blocked = unresolved_anchor(display(guide.path), guide, name, error)
        return ClaimVerdict.fail(None, text, reason=NOT_RUN, summary=blocked)
    try:
        run = run_claim(claim, request, send)
    except RankPoolUnavailable as exc:
        text = claim_header(where, claim, "cannot run") + f"\n{exc}"
        return ClaimVerdict.fail(None, text, reason=NOT_RUN, summary=first_line(str(exc)))
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
        return ClaimVerdict.skip(outcome.skipped, outcome)
    if claim.xfail is not None:
        return _judge_expected_failure(outcome, where, guide, claim, resolutions)
    if not outcome.ok:
        report = outcome.failure or "the check failed without a report"
        return ClaimVerdict.run_failed(outcome, claim_header(where, claim, "failed") + "\n" + report)
    missing = missing_evidence(claim, guide, resolutions, frozenset(outcome.executed or ()))
    if missing:
        return _no_evidence(outcome, where, claim, missing)
    return _judge_views(outcome, where, claim)


def _no_evidence(outcome: CheckRun, where: str, claim: ClaimSpec, missing: str) -> ClaimVerdict:
    """The check passed (or failed as its xfail expects) without running the code its guide reads."""
    text = claim_header(where, claim, "failed") + "\n" + missing
    return ClaimVerdict.fail(outcome, text, reason=NO_EVIDENCE, summary=_said(outcome, missing))


def _said(outcome: CheckRun, otherwise: str) -> str:
    """What the check itself said on its lowest failed rank, if one said something; else ``otherwise``'s first
    line (the verdict's own words)."""
    return finding(outcome) if any(r.message for r in outcome.failed) else first_line(otherwise)


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
        return ClaimVerdict(Status.PASSED, outcome, measured=_measured(outcome))
    shown = ", ".join(f'"{v}"' for v in supported)
    why = (
        f"  the claim declares views = [{', '.join(repr(v) for v in claim.views)}], but its run supports "
        f"[{', '.join(supported) or 'none'}]: a view the run cannot draw would be offered, or one it can would be "
        f"refused\n  fix: write `views = [{shown}]` in the claim's table"
    )
    text = claim_header(where, claim, "failed") + "\n" + why
    return ClaimVerdict.fail(outcome, text, reason=VIEWS_DIFFER, summary=first_line(why))


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
        text = f"{head}\n{why}\n{outcome.failure or ''}".rstrip()
        return ClaimVerdict.fail(outcome, text, reason=check_reason(outcome), summary=_said(outcome, why))
    # Failing as expected counts only if it failed inside the code the guide reads, not before reaching it.
    missing = missing_evidence(claim, guide, resolutions, frozenset(outcome.executed or ()))
    if missing:
        return _no_evidence(outcome, where, claim, missing)
    if not outcome.ok and fails_as_expected(xfail, outcome):
        return ClaimVerdict(Status.XFAILED, outcome, expected, measured=_measured(outcome))
    if xfail.strict:
        head = claim_header(where, claim, "passed unexpectedly (strict xfail)")
        why = (
            f"  it was expected to fail with `{xfail.fails_with}`: {expected}\n"
            "  torch may have fixed it: re-read the guide against this torch, then remove the claim's `xfail`"
        )
        return ClaimVerdict.fail(outcome, f"{head}\n{why}", reason=PASSED_UNEXPECTEDLY, summary=first_line(why))
    return ClaimVerdict(Status.XPASSED, outcome, expected, measured=_measured(outcome))
