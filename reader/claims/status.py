"""What became of an item of a guide: the one vocabulary every view of a claim's result uses.

A claim's verdict (`reader.claims.verdict`) has one of the first five; an anchor item of a guide that
``--approve`` recorded in its session is `Status.APPROVED`. The progress file, the drift report's JSON and the site
keep the values as text; `Status` is a `StrEnum`, so each member is that text, and `Status.named` reads it back.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class Status(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    XFAILED = "xfailed"  # an xfail claim whose check failed as its xfail expects
    XPASSED = "xpassed"  # a non-strict xfail claim whose check passed
    APPROVED = "approved"  # an anchor whose guide ``--approve`` recorded in this session (anchors only)

    @property
    def held(self) -> bool:
        """A claim that holds for approval and for the counts: it passed, or its xfail (strict or not) allows what
        it did. A strict xfail that passes is FAILED by its verdict, never XPASSED."""
        return self in (Status.PASSED, Status.XFAILED, Status.XPASSED)

    @classmethod
    def named(cls, text: object) -> Status | None:
        """The status a stored value names (a progress file written by any version), or None."""
        try:
            return cls(text)
        except ValueError:
            return None


def tally(results: Iterable[Status]) -> tuple[int, int]:
    """(held, failed) among ``results``: what ``list`` and the site's index say of a guide's claims."""
    seen = list(results)
    return sum(1 for s in seen if s.held), sum(1 for s in seen if s is Status.FAILED)
