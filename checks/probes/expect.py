"""Assertions whose failure messages are the probes' renderings (expected vs observed, first divergence marked)."""

from __future__ import annotations

from collections.abc import Sequence

from checks.probes.render import side_by_side, to_text
from checks.violation import Violation


class SequenceMismatch(Violation):
    pass


def assert_sequence(
    observed: Sequence[object], expected: Sequence[object], *, what: str = "sequence", reason: str = "sequence-differs"
) -> None:
    """Fail with both sequences side by side unless they are equal element by element. The `Violation` carries
    ``what``, ``expected``, ``observed`` and ``first`` (the index of the first difference)."""
    observed, expected = list(observed), list(expected)
    if observed != expected:
        first = next((i for i, (a, b) in enumerate(zip(expected, observed, strict=False)) if a != b), None)
        if first is None:
            first = min(len(expected), len(observed))
        raise SequenceMismatch(
            reason,
            f"{what} differs from the expectation:\n" + to_text(side_by_side(expected, observed)),
            what=what,
            expected=expected,
            observed=observed,
            first=first,
        )
