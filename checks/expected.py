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

from collections.abc import Callable, Iterator, Mapping, Sequence
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
        """One observed item per row, in order: fail naming the first row that differs (or the first row not
        observed); an observed item past the last row names the last row. ``text`` is what a row states
        (whitespace made one by default), ``normalise`` what is done to each observed item before comparing."""
        stated = [text(row) for row in self.rows]
        got = [normalise(item) for item in observed]
        if got == stated:
            return
        first = next(
            (i for i, (a, b) in enumerate(zip(got, stated, strict=False)) if a != b), min(len(got), len(stated))
        )
        row = self.rows[min(first, len(self.rows) - 1)] if self.rows else ()
        self.fail(row, reason, f"{what}: {got!r}, expected {stated!r}", observed=got, expected=stated, **details)

    def require_values(
        self,
        observed: Mapping[str, Any],
        *,
        reason: str,
        what: str,
        value: Callable[[Row], Any] = lambda row: row.value,
        **details: Any,
    ) -> None:
        """Observed key → value against each row's key → ``value(row)``: fail naming every row whose value differs
        or whose key was not observed; an observed key no row states fails on the block (no row to name)."""
        stated = {row.key: value(row) for row in self.rows}
        wrong = [row for row in self.rows if row.key not in observed or observed[row.key] != stated[row.key]]
        extra = sorted(set(observed) - set(stated))
        if wrong or extra:
            self.fail(wrong, reason, f"{what}: {dict(observed)!r}, expected {stated!r}", observed=dict(observed),
                      expected=stated, unstated=extra, **details)  # fmt: skip
