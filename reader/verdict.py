"""A claim's verdict from one run: the rule every front end applies (pytest items, ``fsdp-readings check``).

A claim passes only if its check passed on every rank and some anchored torch code ran there (runtime evidence).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from checks.ranks.protocol import CheckRun
from reader.evidence import missing_evidence
from reader.failures import claim_header
from reader.guide import ClaimSpec, Guide


@dataclass(frozen=True)
class ClaimVerdict:
    """What one run of a claim found: its outcome (None when it could not run), why it failed, or why skipped.
    Kept per session, so a predict question reads the run of its claim instead of running it again."""

    outcome: CheckRun | None
    failure: str | None = None
    skipped: str | None = None


def judge(outcome: CheckRun, where: str, guide: Guide, claim: ClaimSpec, resolutions: Any) -> ClaimVerdict:
    """The verdict on a finished run: skipped, failed (with the report), no runtime evidence, or passed."""
    if outcome.skipped:
        return ClaimVerdict(outcome, skipped=outcome.skipped)
    if not outcome.ok:
        report = outcome.failure or "the check failed without a report"
        return ClaimVerdict(outcome, claim_header(where, claim, "failed") + "\n" + report)
    missing = missing_evidence(claim, guide, resolutions, frozenset(outcome.executed or ()))
    if missing:
        return ClaimVerdict(outcome, claim_header(where, claim, "failed") + "\n" + missing)
    return ClaimVerdict(outcome)
