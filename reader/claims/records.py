"""What a run of claims leaves for later, read off their verdicts: each claim's last result in the progress file
(``list`` and the site show it) and the pictures of its last passing run (the site draws them).

``pytest readings/`` and the study commands both record through `record_verdicts`, so the same verdict leaves the
same record whichever ran it.
"""

from __future__ import annotations

from collections.abc import Iterable

from reader.claims.pictures import Pictures
from reader.claims.progress import Progress
from reader.claims.status import Status
from reader.claims.verdict import ClaimVerdict
from reader.format.guide import ClaimSpec

Verdicts = Iterable[tuple[str, ClaimSpec, ClaimVerdict]]  # (guide id, the claim, its verdict)


def record_verdicts(verdicts: Verdicts, torch: str | None, scores: Progress, drawn: Pictures) -> bool:
    """Record each decided verdict's status on ``torch`` in ``scores``, and in ``drawn`` rank 0's pictures of each
    passing claim that declares a view drawing them; whether a picture was kept. A verdict pytest reached without
    `decide` (a skip at setup, an error in the reader) is no result of the claim's: it is not recorded."""
    kept = False
    for guide_id, claim, verdict in verdicts:
        if not verdict.decided:
            continue
        scores.record_claim(guide_id, claim.id, verdict.status, torch)
        if verdict.status is Status.PASSED:
            kept |= drawn.record(guide_id, claim.id, claim.views, verdict.measured, torch)
    return kept
