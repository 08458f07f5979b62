"""An expect block as a check receives it: typed rows that keep their guide line (torch-free, picklable).

The guide parser (`reader.format.expect_rows`) reads each ```` ```expect <name> <shape> ```` fence once, when the
guide is collected, into an `Expected`: a row that does not fit the shape is a guide problem then, with its file
and line, never an error inside a rank. A check receives the whole block under one parameter and fails through
`Expected.fail` (or `require`, `require_rows`, `require_values`), which records the row's key and line in the
`checks.violation.Violation`; the gate's report points at that line, so a reviewer reads the exact sentence that
is now false. Shapes:

- ``lines``: one item per row, the row's text (a message, an event in a sequence).
- ``pairs``: ``a → b`` (``->`` also reads as the arrow); ``key`` is ``a``, ``value`` is ``b``.
- ``mapping``: ``key: values``; the key is what comes before the first ``": "``; keys are unique.
- ``table``: a header row, then rows whose cells are separated by two or more spaces, one per header cell;
  ``key`` is the first cell, unique.

A row may continue on the next line, indented deeper than the block's rows (not in a table): the continuation
joins the row with one space and the row keeps its first line's number.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

from checks.violation import Violation

SHAPES = ("lines", "pairs", "mapping", "table")


@dataclass(frozen=True)
class Row:
    """One row as the guide writes it, and where."""

    line: int  # the row's (first) line in the guide
    text: str  # as written: the first line stripped, continuation lines joined with one space
    key: str  # pairs: the left side; mapping: before ': '; table: the first cell; lines: the text
    value: str = ""  # pairs: the right side; mapping: after ': '; table: the other cells joined by two spaces
    cells: tuple[str, ...] = ()  # table: every cell; pairs: (a, b); mapping: (key, value); lines: (text,)

    @property
    def words(self) -> list[str]:
        return self.text.split()

    @property
    def flat(self) -> str:
        """The text with runs of spaces made one: what a check compares when columns are aligned by hand."""
        return " ".join(self.text.split())

    def record(self, block: str) -> dict[str, Any]:
        """What a `Violation` carries back from the rank to name this row (plain data)."""
        return {"block": block, "line": self.line, "key": self.key}


@dataclass(frozen=True)
class Expected:
    """A block's rows, its shape's accessors, and the failing helpers that name a row."""

    name: str
    shape: str
    rows: tuple[Row, ...]
    line: int  # the opening fence's line
    header: tuple[str, ...] = ()  # table: the header's cells

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    # -- the shape's accessors -------------------------------------------------------------------------------------
    @property
    def texts(self) -> list[str]:
        return [row.text for row in self.rows]

    @property
    def flats(self) -> list[str]:
        return [row.flat for row in self.rows]

    @property
    def keys(self) -> list[str]:
        return [row.key for row in self.rows]

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return [(row.key, row.value) for row in self.rows]

    @property
    def mapping(self) -> dict[str, str]:
        """Key → value; keys are unique in a mapping and a table (the parser refuses a repeated one)."""
        return {row.key: row.value for row in self.rows}

    def row(self, key: str) -> Row:
        for row in self.rows:
            if row.key == key:
                return row
        raise KeyError(f"expect block `{self.name}` has no row `{key}`; its keys: {self.keys}")

    def column(self, name: str) -> dict[str, str]:
        """A table's column: row key → that column's cell."""
        if name not in self.header:
            raise KeyError(f"expect table `{self.name}` has no column `{name}`; its header: {list(self.header)}")
        index = self.header.index(name)
        return {row.key: row.cells[index] for row in self.rows}

    def cells(self, row: Row) -> dict[str, str]:
        """A table row as header cell → cell."""
        return dict(zip(self.header, row.cells, strict=True))

    # -- failing, naming the row ------------------------------------------------------------------------------------
    def fail(self, rows: Row | Sequence[Row], reason: str, message: str, **details: Any) -> NoReturn:
        """Raise `Violation` naming ``rows`` (the rows of this block that the observation makes false)."""
        named = (rows,) if isinstance(rows, Row) else tuple(rows)
        where = ", ".join(f"line {r.line}" for r in named)
        raise Violation(
            reason,
            f"{message} (expect `{self.name}`{', ' + where if where else ''})",
            expect_rows=tuple(r.record(self.name) for r in named),
            **details,
        )

    def require(self, condition: object, rows: Row | Sequence[Row], reason: str, message: str, **details: Any) -> None:
        if not condition:
            self.fail(rows, reason, message, **details)

    def differing_rows(
        self,
        observed: Sequence[str],
        *,
        text: Callable[[Row], str] = lambda row: row.flat,
        normalise: Callable[[str], str] = lambda value: " ".join(value.split()),
    ) -> list[Row]:
        """One observed item per row, in order: the first row that differs (or the first row not observed; an
        observed item past the last row names the last row), or none when every row reads as observed. ``text`` is
        what a row states (whitespace made one by default), ``normalise`` what is done to each observed item."""
        stated = [text(row) for row in self.rows]
        got = [normalise(item) for item in observed]
        if got == stated or not self.rows:
            return []
        pairs = enumerate(zip(got, stated, strict=False))
        first = next((i for i, (a, b) in pairs if a != b), min(len(got), len(stated)))
        return [self.rows[min(first, len(self.rows) - 1)]]

    def differing_values(
        self,
        observed: Mapping[str, Any],
        *,
        value: Callable[[Row], Any] = lambda row: row.value,
        keys: Collection[str] | None = None,
    ) -> list[Row]:
        """Observed key → value against each row's key → ``value(row)``: every row (of ``keys`` only, when given)
        whose value differs or whose key was not observed."""
        rows = [row for row in self.rows if keys is None or row.key in keys]
        return [row for row in rows if row.key not in observed or observed[row.key] != value(row)]

    def require_rows(
        self,
        observed: Sequence[str],
        *,
        reason: str,
        what: str,
        text: Callable[[Row], str] = lambda row: row.flat,
        normalise: Callable[[str], str] = lambda value: " ".join(value.split()),
        **details: Any,
    ) -> None:
        """Fail naming `differing_rows` unless the observed items read as the rows, in order."""
        stated = [text(row) for row in self.rows]
        got = [normalise(item) for item in observed]
        if got != stated:
            rows = self.differing_rows(observed, text=text, normalise=normalise)
            self.fail(rows, reason, f"{what}: {got!r}, expected {stated!r}", observed=got, expected=stated, **details)

    def require_values(
        self,
        observed: Mapping[str, Any],
        *,
        reason: str,
        what: str,
        value: Callable[[Row], Any] = lambda row: row.value,
        **details: Any,
    ) -> None:
        """Fail naming `differing_values` unless each row's key was observed with its value; an observed key no row
        states fails on the block (there is no row to name)."""
        stated = {row.key: value(row) for row in self.rows}
        wrong = self.differing_values(observed, value=value)
        extra = sorted(set(observed) - set(stated))
        if wrong or extra:
            self.fail(wrong, reason, f"{what}: {dict(observed)!r}, expected {stated!r}", observed=dict(observed),
                      expected=stated, unstated=extra, **details)  # fmt: skip

    @contextmanager
    def naming_false_rows(self, false_rows: Callable[[], Sequence[Row]]) -> Iterator[None]:
        """For comparisons with a torch-free model made before the guide's rows are read: a `Violation` raised
        inside is raised again through this block, with its reason, message and details, naming the rows
        ``false_rows()`` finds false in the same run (as it is, when it names rows already or none is false). The
        model catches a changed torch first; the report still points at the guide's sentence it makes false."""
        try:
            yield
        except Violation as violation:
            rows = false_rows()
            if violation.expect_rows or not rows:
                raise
            failure = violation
        else:
            return
        self.fail(rows, failure.reason, str(failure), **failure.details)
