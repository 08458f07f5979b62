"""Exact code patterns, matched as Python token sequences.

A pattern (an anchor's ``pattern`` or a note's ``"<code pattern>"``) matches where its tokens appear
contiguously in the anchor's code tokens. Comparing tokens rather than characters means a pattern survives
re-wrapping and re-spacing (``_unshard(state, handles, ...)`` split over three lines still matches) but not
any change to the code itself; comments never match. ``enclosing_statement`` maps a match to the innermost
statement containing it, which is what an anchor narrowed by ``pattern`` quotes and fingerprints.
"""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass

from reader.source.fingerprint import SnippetSyntaxError, parse_snippet

_SKIPPED = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
    tokenize.ENCODING,
}


class PatternError(ValueError):
    """The pattern is not a sequence of Python tokens."""


@dataclass(frozen=True)
class Match:
    start: tuple[int, int]  # (1-based line, 0-based column) within the searched text
    end: tuple[int, int]


def pattern_tokens(pattern: str) -> list[str]:
    tokens: list[str] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(pattern.strip()).readline):
            if tok.type == tokenize.ERRORTOKEN and tok.string.strip():
                raise PatternError(f"`{tok.string}` is not a Python token")
            if tok.type not in _SKIPPED and tok.string.strip():
                tokens.append(tok.string)
    except tokenize.TokenError as exc:
        if "multi-line statement" not in str(exc.args[0]):  # an unclosed bracket is a fine prefix
            raise PatternError(str(exc.args[0])) from exc
    except (SyntaxError, IndentationError) as exc:
        raise PatternError(str(exc)) from exc
    if not tokens:
        raise PatternError("the pattern holds no code tokens")
    return tokens


def _code_tokens(text: str) -> list[tokenize.TokenInfo]:
    found: list[tokenize.TokenInfo] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type not in _SKIPPED and tok.string.strip():
                found.append(tok)
    except (tokenize.TokenError, SyntaxError):
        pass  # a snippet cut mid-statement still yields every token before the cut
    return found


def find(text: str, pattern: str) -> list[Match]:
    """Every (possibly overlapping) occurrence of ``pattern``'s tokens in ``text``."""
    wanted = pattern_tokens(pattern)
    tokens = _code_tokens(text)
    width = len(wanted)
    return [
        Match(tokens[i].start, tokens[i + width - 1].end)
        for i in range(len(tokens) - width + 1)
        if [t.string for t in tokens[i : i + width]] == wanted
    ]


def enclosing_statement(text: str, match: Match) -> tuple[int, int]:
    """Lines (1-based, inclusive, within ``text``) of the innermost statement that contains the whole
    match."""
    try:
        statements = parse_snippet(text)
    except SnippetSyntaxError:
        return match.start[0], match.end[0]
    lines = text.split("\n")
    best: tuple[int, int] | None = None
    for stmt in statements:
        for node in ast.walk(stmt):
            if not isinstance(node, ast.stmt):
                continue
            first_line = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", ())])
            start = (
                first_line,
                0 if first_line != node.lineno else _col(lines, node.lineno, node.col_offset),
            )
            end_line = node.end_lineno or node.lineno
            end = (end_line, _col(lines, end_line, node.end_col_offset or 0))
            if start <= match.start and match.end <= end:
                span = (start[0], end[0])
                # ast.walk is breadth-first: a later containing node is deeper, or a sibling that cannot also
                # contain.
                best = span
    return best if best is not None else (match.start[0], match.end[0])


def _col(lines: list[str], lineno: int, byte_col: int) -> int:
    """ast columns count UTF-8 bytes; tokenize columns count characters."""
    line = lines[lineno - 1] if 0 < lineno <= len(lines) else ""
    return len(line.encode("utf-8")[:byte_col].decode("utf-8", errors="ignore"))
