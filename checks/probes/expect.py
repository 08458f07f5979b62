"""Assertions whose failure messages are the probes' renderings (expected vs observed, first divergence marked)."""

from __future__ import annotations

from collections.abc import Sequence

from checks.probes.render import side_by_side, to_text


class SequenceMismatch(AssertionError):
    pass


def assert_sequence(observed: Sequence[object], expected: Sequence[object], *, what: str = "sequence") -> None:
    """Fail with both sequences side by side unless they are equal element by element."""
    if list(observed) != list(expected):
        raise SequenceMismatch(f"{what} differs from the expectation:\n" + to_text(side_by_side(expected, observed)))
