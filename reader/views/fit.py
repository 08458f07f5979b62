"""Lines that fit any terminal: fixed fields first, then a name that is never cut or broken inside a word.

Ids (``08-post-backward-reduce-scatter``, ``summon-offload-raises-without-orig-params``) are words: folding one
letter by letter makes it unreadable and impossible to paste. A name that does not fit beside its fields moves
to a line of its own, indented, instead.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.console import Console, Group, JustifyMethod, RenderableType
from rich.table import Table
from rich.text import Text

INDENT = "    "


def fitted(head: Text, name: str, width: int, style: str = "") -> Text:
    """``head`` then ``name`` on one line when both fit in ``width`` cells; else ``name`` on the next line."""
    line = head.copy()
    if head.cell_len + len(name) <= width:
        line.append(name, style=style)
    else:
        line.rstrip()
        line.append("\n" + INDENT)
        line.append(name, style=style)
    line.no_wrap = True
    line.overflow = "ignore"
    return line


def indented(text: str, width: int, style: str = "", indent: str = "  ") -> Text:
    """``text`` wrapped at words to ``width``, every line indented (no trailing spaces, no word broken)."""
    lines = textwrap.wrap(text, width - len(indent), break_long_words=False, break_on_hyphens=False) or [""]
    return Text("\n".join(indent + line for line in lines), style=style, no_wrap=True, overflow="ignore")


def items_line(items: list[Text], width: int, indent: str = "  ", separator: str = " · ") -> Text:
    """Styled items joined by ``separator``, a new indented line wherever the next item would pass ``width``."""
    line, column = Text(indent), len(indent)
    for i, item in enumerate(items):
        joiner = separator if i else ""
        if i and column + len(joiner) + item.cell_len > width:
            line.append("\n" + indent)
            column, joiner = len(indent), ""
        line.append(joiner)
        line.append_text(item)
        column += len(joiner) + item.cell_len
    line.no_wrap, line.overflow = True, "ignore"
    return line


@dataclass(frozen=True)
class Column:
    """A column of a `fit_table`: a name (its header), its justification, and whether it holds prose (wraps at
    words) or a value (``"id"`` or ``"value"``: never wrapped, never cut)."""

    name: str
    justify: JustifyMethod = "left"
    prose: bool = False


Cell = str | Text


def fit_table(
    console: Console, title: str, columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int | None = None
) -> RenderableType:
    """A table when every value fits whole and every prose column keeps its longest word; else one record per row
    (its first cell as a heading, then one ``column: value`` line per other column, wrapped at words and indented).
    Nothing is cropped, and no word is broken, at any width."""
    width = width if width is not None else console.width
    prose = any(column.prose for column in columns)  # rows of several lines: a rule between rows
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True, show_lines=prose)
    for column in columns:
        table.add_column(column.name, justify=column.justify, no_wrap=not column.prose, overflow="fold")
    for row in rows:
        table.add_row(*row)
    if _fits(title, columns, rows, width):
        return Group(indented(title, width, "bold", indent=""), table)
    lines: list[RenderableType] = [indented(title, width, "bold", indent="")]
    label_width = max(len(c.name) for c in columns[1:]) if len(columns) > 1 else 0
    for row in rows:
        head = row[0] if isinstance(row[0], Text) else Text(row[0])
        lines.append(Text.assemble(head.copy().plain, style="bold"))
        for column, cell in zip(columns[1:], row[1:], strict=True):
            plain = cell.plain if isinstance(cell, Text) else cell
            for i, part in enumerate(plain.split("\n")):
                label = f"{column.name if i == 0 else '':<{label_width}}  "
                lines.append(_labelled(label, part, width))
    return Group(*lines)


def _fits(title: str, columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int) -> bool:
    """Whether the table fits ``width`` with no value cut and no word folded: headers and values at full length,
    prose at its longest word; the title, which wraps, at its longest word."""
    needed = 0
    for column, cells in _by_column(columns, rows):
        header = _longest(column.name, column.prose)
        needed += max([header, *(_longest(cell, column.prose) for cell in cells)])
    needed += 2 * (len(columns) - 1)  # SIMPLE_HEAD without edges, padding collapsed: one space and one divider
    return needed <= width and _longest(title, prose=True) <= width


def _by_column(columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> list[tuple[Column, list[Cell]]]:
    return [(column, [row[i] for row in rows]) for i, column in enumerate(columns)]


def _longest(cell: Cell, prose: bool) -> int:
    plain = cell.plain if isinstance(cell, Text) else cell
    lines = plain.split("\n")
    if prose:
        return max((len(word) for line in lines for word in line.split()), default=0)
    return max((len(line) for line in lines), default=0)


def _labelled(label: str, value: str, width: int) -> Text:
    """``label`` then ``value`` wrapped at words, continuation lines under the value."""
    indent = "  " + " " * len(label)
    wrapped = textwrap.wrap(value, max(width - len(indent), 20), break_long_words=False, break_on_hyphens=False)
    text = Text("  ")
    text.append(label, style="dim")
    text.append(("\n" + indent).join(wrapped or [""]))
    text.no_wrap, text.overflow = True, "ignore"
    return text


def with_code(text: str, style: str = "", code_style: str = "cyan") -> Text:
    """A sentence whose Markdown code spans (```x```) show as styled code without their backticks; one with an
    unbalanced backtick shows as it is written."""
    parts = text.split("`")
    if len(parts) % 2 == 0:
        return Text(text, style=style)
    out = Text(style=style)
    for i, part in enumerate(parts):
        out.append(part, style=code_style if i % 2 else "")
    return out


def plain_code(text: str) -> str:
    """A sentence with its code spans' backticks dropped (where a line is wrapped as plain text); unbalanced
    backticks stay."""
    return text.replace("`", "") if text.count("`") % 2 == 0 else text
