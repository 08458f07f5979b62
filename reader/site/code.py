"""Quoted torch lines as HTML: highlighted once as a whole (a segment that starts inside a docstring is still a
string), then cut into one fragment per file line, each a run of ``<span class>`` tokens with pygments' short
class names, styled by the stylesheet `stylesheet` writes."""

from __future__ import annotations

from html import escape

from pygments import lex
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer
from pygments.token import STANDARD_TYPES, _TokenType

STYLE = "default"


def _css_class(kind: _TokenType) -> str:
    while kind not in STANDARD_TYPES and kind.parent is not None:
        kind = kind.parent
    return STANDARD_TYPES.get(kind, "")


def highlighted_lines(code: str) -> list[str]:
    """One HTML fragment per line of ``code`` (its trailing newline is no line)."""
    lines: list[list[str]] = [[]]
    for kind, value in lex(code.removesuffix("\n"), PythonLexer(stripnl=False, ensurenl=False)):
        css = _css_class(kind)
        for index, piece in enumerate(value.split("\n")):
            if index:
                lines.append([])
            if piece:
                lines[-1].append(f'<span class="{css}">{escape(piece)}</span>' if css else escape(piece))
    return ["".join(parts) for parts in lines]


def stylesheet() -> str:
    """The token colours, scoped to quoted code."""
    return HtmlFormatter(style=STYLE).get_style_defs(".code")
