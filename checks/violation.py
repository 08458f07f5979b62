"""How a check says its claim does not hold: a `Violation` with a stable reason and plain-data details.

A check raises `Violation` (through `require` / `require_equal`, or the probes' `assert_sequence`) instead of a
bare ``assert``. The rank sends the reason and the details back beside the rendered traceback, so a break-it test
asserts *why* the claim failed (``run.reason == "freed-after-forward"``, ``run.details["observed"]``) rather
than matching text, and a study view can show the observed value. A check that compares against a guide's
expect block fails through `checks.expected.Expected.fail`, which adds the rows it makes false (``expect_rows``).
Reasons are kebab-case and stable: renaming one is a change to every break-it test that names it.
"""

from __future__ import annotations

import re
from typing import Any

REASON_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


class Violation(AssertionError):
    """The check's own finding: ``reason`` names what went wrong, ``details`` hold the values it compared."""

    def __init__(
        self, reason: str, message: str, *, expect_rows: tuple[dict[str, Any], ...] = (), **details: Any
    ) -> None:
        if not REASON_RE.match(reason):
            raise ValueError(f"a violation's reason is kebab-case (like `freed-after-forward`), not {reason!r}")
        super().__init__(message)
        self.reason = reason
        self.details = details
        # The guide's expect rows this finding makes false ({"block", "line", "key"} each), recorded by
        # `checks.expected.Expected.fail`: the report points at them without reading the message.
        self.expect_rows = expect_rows


def require(condition: object, reason: str, message: str, **details: Any) -> None:
    """Raise `Violation` unless ``condition`` holds."""
    if not condition:
        raise Violation(reason, message, **details)


def require_equal(observed: Any, expected: Any, *, reason: str, what: str, **details: Any) -> None:
    """Raise `Violation` (with ``observed`` and ``expected`` in its details) unless the two are equal."""
    if observed != expected:
        raise Violation(
            reason, f"{what}: {observed!r}, expected {expected!r}", observed=observed, expected=expected, **details
        )
