"""An expect fence's lines → typed rows (`checks.expected.Expected`), each keeping its guide line.

The fence names the shape (```` ```expect held mapping ````); a line that does not fit it is a problem at
collection time, pinned to that line, with the fix. A line indented deeper than the block's first row continues
the row above (not in a table, whose cells are columns): it joins the row with one space, and the row keeps its
first line's number, so a long row fits 78 columns without becoming two rows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from checks.expected import SHAPES, Expected, Row
from reader.format.body import BodyContext, Fence

ARROW = re.compile(r"\s*(?:→|->)\s*")
MAPPING_SEPARATOR = re.compile(r":(?:\s+|$)")
TABLE_GAP = re.compile(r"\s{2,}")

FIX = {
    "pairs": "write the row as `<from> → <to>`: one arrow (`→` or `->`) with text on both sides",
    "mapping": "write the row as `<key>: <values>`; the key is what comes before the first `: `",
    "table": "separate a table's cells by two or more spaces, one cell per header cell (the first row)",
}


class _Problem(ValueError):
    """A row that does not fit its block's shape (message; the fix is the shape's)."""


def _lines(line: int, text: str) -> Row:
    return Row(line, text, text, "", (text,))


def _pairs(line: int, text: str) -> Row:
    sides = ARROW.split(text)
    if len(sides) != 2 or not all(s.strip() for s in sides):
        arrows = len(sides) - 1
        raise _Problem(f"a pairs row has one arrow with text on both sides; `{text}` has {arrows} arrow(s)")
    return Row(line, text, sides[0].strip(), sides[1].strip(), (sides[0].strip(), sides[1].strip()))


def _mapping(line: int, text: str) -> Row:
    found = MAPPING_SEPARATOR.search(text)
    if found is None or not text[: found.start()].strip() or not text[found.end() :].strip():
        raise _Problem(f"a mapping row is `key: values`; `{text}` has no key, no `: ` or no values")
    key, value = text[: found.start()].strip(), text[found.end() :].strip()
    return Row(line, text, key, value, (key, value))


ROW_PARSERS: dict[str, Callable[[int, str], Row]] = {"lines": _lines, "pairs": _pairs, "mapping": _mapping}


def parse_row(shape: str, line: int, text: str, header: tuple[str, ...] = ()) -> Row:
    """One row of ``shape`` as the parser reads it (a table's against its header); `ValueError` when it does not
    fit. For tests that restate a guide's row: the row they build is the one the guide would give."""
    if shape != "table":
        return ROW_PARSERS[shape](line, text)
    cells = tuple(TABLE_GAP.split(text))
    if len(cells) != len(header):
        raise _Problem(f"a table row has {len(header)} cells like its header; `{text}` has {len(cells)}")
    return Row(line, text, cells[0], "  ".join(cells[1:]), cells)


def expected_rows(name: str, shape: str, fence: Fence, context: BodyContext) -> Expected | None:
    """The block's rows, or None after recording each line that does not fit ``shape``."""
    first_line, fence_line = fence.start + 1, fence.start
    raw = fence.content.split("\n")
    if raw and raw[-1] == "":
        raw.pop()
    lines = [(first_line + offset, text) for offset, text in enumerate(raw) if text.strip()]
    if not lines:
        return None
    indent = min(len(text) - len(text.lstrip()) for _, text in lines)
    joined: list[tuple[int, str]] = []
    bad = False
    for number, text in lines:
        deeper = len(text) - len(text.lstrip()) > indent
        if deeper and shape == "table":
            context.problem(number, "a table row cannot continue on the next line", FIX["table"])
            bad = True
        elif deeper and joined:
            joined[-1] = (joined[-1][0], f"{joined[-1][1]} {text.strip()}")
        elif deeper:
            fix = "start every row at the same indent; indent only a line that continues the row above"
            context.problem(number, "the block's first row is indented deeper than the rows after it", fix)
            bad = True
        else:
            joined.append((number, text.strip()))
    rows, header = _table(joined, context) if shape == "table" else (_rows(shape, joined, context), ())
    if rows is None or bad:
        return None
    if shape in ("mapping", "table") and not _unique(rows, shape, context):
        return None
    return Expected(name, shape, tuple(rows), fence_line, header)


def _rows(shape: str, joined: Sequence[tuple[int, str]], context: BodyContext) -> list[Row] | None:
    rows, bad = [], False
    for number, text in joined:
        try:
            rows.append(ROW_PARSERS[shape](number, text))
        except _Problem as problem:
            context.problem(number, str(problem), FIX[shape])
            bad = True
    return None if bad else rows


def _table(joined: Sequence[tuple[int, str]], context: BodyContext) -> tuple[list[Row] | None, tuple[str, ...]]:
    (_, head), *body = joined
    header = tuple(TABLE_GAP.split(head))
    if not body:
        context.problem(joined[0][0], "a table has a header and at least one row", FIX["table"])
        return None, header
    rows, bad = [], False
    for number, text in body:
        try:
            rows.append(parse_row("table", number, text, header))
        except _Problem as problem:
            context.problem(number, str(problem), FIX["table"])
            bad = True
    return (None if bad else rows), header


def _unique(rows: Sequence[Row], shape: str, context: BodyContext) -> bool:
    seen: dict[str, int] = {}
    ok = True
    for row in rows:
        if row.key in seen:
            context.problem(row.line, f"the key `{row.key}` is already a row of this {shape} (line {seen[row.key]})",
                            "give each row its own key, or use the `lines` shape for a sequence")  # fmt: skip
            ok = False
        seen.setdefault(row.key, row.line)
    return ok


__all__ = ["SHAPES", "expected_rows", "parse_row"]
