"""Whether a guide may be approved on this torch, and what the lock then records of its claims.

Approval cannot record a lie: a guide is approved whole or not at all, and only when every claim of it ran on
this torch in the same session and held (passed, or failed exactly as its xfail expects). A claim that failed or
did not run refuses the approval, unless a person gives ``--force`` with a reason, which the lock keeps beside
the claims that failed. Anchors that cannot be pinned (removed, a lost pattern or note) refuse it always: there
is no source to record. The front ends (``pytest --approve``, ``fsdp-readings approve``) hand in each claim's
verdict, reached by ``reader.claims.verdict.decide``; nothing here runs a claim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from reader.claims.status import Status
from reader.format.guide import Guide
from reader.gate.drift import Drift
from reader.gate.lock_entries import GuideRecord

if TYPE_CHECKING:
    from reader.claims.verdict import ClaimVerdict
FORCE_HINT = 'fix the guide, scope the claim to the torch it holds for (`torch = "<2.15"`), or approve anyway ' \
    'with --force "<why>" (the reason is kept in the lock)'  # fmt: skip


class NotApprovable(Exception):
    """A guide that cannot be approved, with every reason and what to do (``forceable``: ``--force`` would)."""

    def __init__(
        self, guide_id: str, reasons: Sequence[str], *, drifts: Sequence[Drift] = (), forceable: bool = False
    ) -> None:
        self.guide_id = guide_id
        self.reasons = list(reasons)
        self.drifts = list(drifts)
        self.forceable = forceable
        super().__init__(f"{guide_id} not approved:\n" + "\n".join(f"  {r}" for r in self.reasons))


@dataclass
class ClaimsOutcome:
    """The claims of a guide, sorted by what they did."""

    held: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


def sort_claims(guide: Guide, results: Mapping[str, ClaimVerdict], torch_version: str | None) -> ClaimsOutcome:
    outcome = ClaimsOutcome()
    for claim in guide.claims:
        result = results.get(claim.id)
        if result is None:
            outcome.not_run.append(claim.id)
            outcome.reasons.append(
                f"claim `{claim.id}` did not run in this session (deselected, or the session stopped before it): "
                "approval needs every claim of the guide to run, so run them all"
            )
        elif result.status.held:
            outcome.held.append(claim.id)
        elif result.status is Status.SKIPPED:
            outcome.skipped.append(claim.id)
        else:
            outcome.failed.append(claim.id)
            found = f"`{result.reason}` {result.summary}" if result.reason else result.summary
            said = f": {found}" if found else ""
            outcome.reasons.append(f"claim `{claim.id}` failed on torch {torch_version}{said}")
    return outcome


def claims_record(
    guide: Guide, results: Mapping[str, ClaimVerdict], torch_version: str | None, force: str | None
) -> GuideRecord:
    """What the lock records of the guide's claims on this torch; raises `NotApprovable` when one failed or did
    not run and no ``force`` reason was given."""
    outcome = sort_claims(guide, results, torch_version)
    if outcome.reasons and force is None:
        raise NotApprovable(guide.id, [*outcome.reasons, FORCE_HINT], forceable=True)
    return GuideRecord(
        held=len(outcome.held),
        skipped=tuple(outcome.skipped),
        failed=tuple(outcome.failed) if force is not None else (),
        not_run=tuple(outcome.not_run) if force is not None else (),
        forced=force if force is not None and outcome.reasons else None,
    )


def force_reason(text: str | None) -> str | None:
    """A ``--force`` reason as the lock keeps it, or `ValueError` when it says nothing."""
    if text is None:
        return None
    reason = " ".join(text.split())
    if len(reason) < 10:
        raise ValueError(
            f"--force needs the reason a person approves anyway, in words (got {text!r}), e.g. "
            '--force "2.15 reduces bf16 gradients in fp32: a behaviour change, guide re-read"'
        )
    return reason
