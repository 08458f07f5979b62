"""How this guide's checks word a figure (`ratio`), and which of the guide's rows a model check's failure makes
false (`naming_false_rows`): every subject of the package compares the run with a torch-free model first and with
the guide's expect block last, so a bent torch fails the model comparison before the guide's rows are compared.
The failure keeps the model comparison's reason and details, and names the rows the same run makes false, for the
report to point at."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from fractions import Fraction

from checks.expected import Expected, Row
from checks.violation import Violation


def ratio(value: Fraction) -> str:
    """``3/2``, or ``1`` for a whole number: a ratio as the guide writes it."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def differing_values(expected: Expected, observed: Mapping[str, str], keys: Collection[str] | None = None) -> list[Row]:
    """The rows (of ``keys`` only, when given) whose key was not observed or whose value differs from it."""
    return [row for row in expected
            if (keys is None or row.key in keys) and observed.get(row.key) != row.value]  # fmt: skip


def first_differing_row(expected: Expected, observed: Sequence[str]) -> list[Row]:
    """The first row whose text differs from the observed item at its place (as `Expected.require_rows` names
    it: an observed item past the last row names the last row); none when every row reads as observed."""
    stated, got = expected.flats, [" ".join(item.split()) for item in observed]
    if stated == got or not expected.rows:
        return []
    first = next((i for i, (a, b) in enumerate(zip(got, stated, strict=False)) if a != b), min(len(got), len(stated)))
    return [expected.rows[min(first, len(expected.rows) - 1)]]


@contextmanager
def naming_false_rows(expected: Expected, false_rows: Callable[[], Sequence[Row]]) -> Iterator[None]:
    """Model comparisons inside: a `Violation` they raise is raised again through ``expected``, with its reason,
    message and details, naming the rows ``false_rows()`` finds false in the same run (as it is, when none is)."""
    try:
        yield
    except Violation as violation:
        rows = false_rows()
        if violation.expect_rows or not rows:
            raise
        failure = violation
    else:
        return
    expected.fail(rows, failure.reason, str(failure), **failure.details)
