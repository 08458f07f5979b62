"""The built-in body parsers: ```` ```source <anchor> ```` and ```` ```expect <name> ```` fences.

Registered with ``reader.format.body`` when this module is imported (``reader.format.parse`` imports it), the same way a
new fence kind registers its parser from its own module.
"""

from __future__ import annotations

import ast
import io
import re
import textwrap
import tokenize
from collections.abc import Iterator, Sequence
from dataclasses import replace

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from reader.format.body import BodyContext, Fence, register_body_parser
from reader.format.errors import Problems, anchor_fix, did_you_mean
from reader.format.expect_rows import SHAPES, expected_rows
from reader.format.guide import ExpectBlock, Guide, Note, Region, SourceBlock, block_reference
from reader.source.patterns import PatternError, pattern_tokens

# `note "<pattern>" [torch >=2.15]: text`, ```source <anchor> [torch <2.15], ```expect <name> [torch >=2.15]: a
# note or block that holds only for some torch releases (a lock approved on a matrix of releases quotes code that
# differs between them).
_NOTE_SCOPE = re.compile(r"^\[torch\s+([^\]]+)\]")
_FENCE_SCOPE = re.compile(r"^\[torch\s+([^\]]+)\]$")


class _BadScope(ValueError):
    """A ``[torch SPEC]`` whose SPEC is not a specifier (already recorded as a problem)."""


def _fence_scope(fence: Fence, context: BodyContext, example: str) -> tuple[str, SpecifierSet | None] | None:
    """A fence's one name and its optional ``[torch SPEC]``; None when the info string is not that shape.
    Raises `_BadScope` (after recording the problem) for a SPEC that is not a specifier."""
    if not fence.args:
        return None
    name, rest = fence.args[0], " ".join(fence.args[1:])
    if not rest:
        return name, None
    scope = _FENCE_SCOPE.match(rest)
    if scope is None:
        return None
    try:
        return name, SpecifierSet(scope.group(1))
    except InvalidSpecifier:
        context.problem(
            fence.start,
            f"`[torch {scope.group(1)}]` is not a PEP 440 version specifier",
            f"scope the block to torch releases as {example}",
        )
        raise _BadScope(scope.group(1)) from None


def source_blocks(fences: Sequence[Fence], context: BodyContext) -> Iterator[SourceBlock]:
    """```` ```source <anchor> ```` fences. The fence holds only notes; the code is read live from torch."""
    for fence in fences:
        try:
            found = _fence_scope(fence, context, "```source <anchor-name> [torch >=2.15]")
        except _BadScope:
            continue
        if found is None:
            context.problem(
                fence.start,
                f"a source block names one anchor, got `{fence.info}`",
                "write the opening fence as ```source <anchor-name>, or ```source <anchor-name> [torch >=2.15] "
                "for code only some releases have",
            )
            continue
        name, versions = found
        if name not in context.anchors:
            context.problem(
                fence.start,
                f"source block names `{name}`, which is not an anchor of this guide",
                anchor_fix(name, context.anchors),
            )
        notes = tuple(_notes(fence.content, fence.start + 1, context))
        yield SourceBlock(name, notes, fence.start, fence.end, versions)


def expect_blocks(fences: Sequence[Fence], context: BodyContext) -> Iterator[ExpectBlock]:
    """```` ```expect <name> <shape> ```` fences: rows of a shape (`reader.format.expect_rows`), handed to the
    claims that ask as one `checks.expected.Expected`."""
    seen: dict[str, tuple[int, SpecifierSet | None]] = {}
    for fence in fences:
        start = fence.start
        shape = fence.args[1] if len(fence.args) > 1 and fence.args[1] in SHAPES else None
        named = replace(fence, args=(fence.args[0], *fence.args[2:])) if shape else fence
        try:
            found = _fence_scope(named, context, "```expect <name> <shape> [torch >=2.15]")
        except _BadScope:
            continue
        if found is None or shape is None:
            context.problem(
                start,
                f"an expect block has a name and a shape, got `{fence.info}`",
                f"write ```expect <name> <shape>, the shape one of {', '.join(SHAPES)}; add [torch >=2.15] "
                "for what only some releases do",
            )
            continue
        name, versions = found
        if name in seen and (versions is None or seen[name][1] is None):
            context.problem(
                start,
                f"duplicate expect block `{name}` (first on line {seen[name][0]})",
                "rename one of them, or give each the torch releases it holds for ([torch <2.15], [torch >=2.15])",
            )
            continue
        seen.setdefault(name, (start, versions))
        # as written, less the block's own indent: a continuation line stays indented under its row
        items = tuple(line.rstrip() for line in textwrap.dedent(fence.content).split("\n") if line.strip())
        if not items:
            context.problem(start, f"expect block `{name}` is empty", "write one expected row per line")
        expected = expected_rows(name, shape, fence, context) if items else None
        yield ExpectBlock(name, items, start, fence.end, versions, shape, expected)


def check_block_references(guide: Guide, regions: Sequence[Region], problems: Problems) -> None:
    """Every ``{ expect = "<name>" }`` kwarg of a claim must name an expect block of the guide."""
    names = {r.name for r in regions if isinstance(r, ExpectBlock)}
    for claim in guide.claims:
        for key, value in claim.kwargs.items():
            name = block_reference(value)
            if name is not None and name not in names:
                problems.add(
                    claim.line,
                    f"claim `{claim.id}` takes `{key}` from expect block `{name}`, which this guide does not have",
                    did_you_mean(name, names)
                    or f"add a fence ```expect {name} <shape> to the prose (lines, pairs, mapping or table)",
                )


def _notes(content: str, first_line: int, context: BodyContext) -> Iterator[Note]:
    pending: Note | None = None
    for offset, raw in enumerate(content.split("\n")[:-1] if content.endswith("\n") else content.split("\n")):
        number = first_line + offset
        if not raw.strip():
            if pending:
                yield pending
            pending = None
            continue
        if raw[0] in " \t" and pending is not None:  # an indented line continues the note above
            pending = replace(pending, text=f"{pending.text} {raw.strip()}")
            continue
        if pending:
            yield pending
            pending = None
        note = _note(raw, number, context)
        if note is not None:
            pending = note
    if pending:
        yield pending


def _note(raw: str, number: int, context: BodyContext) -> Note | None:
    fix = 'write `note "<code pattern>": <text>`; the anchor\'s code is quoted live, so the block holds only notes'
    if not re.match(r"^note\s", raw):
        context.problem(number, f"unknown line in a source block: `{raw.strip()}`", fix)
        return None
    rest = raw[4:].lstrip()
    try:
        token = next(tokenize.generate_tokens(io.StringIO(rest).readline))
    except (tokenize.TokenError, SyntaxError, StopIteration):
        token = None
    if token is None or token.type != tokenize.STRING:
        context.problem(number, "a note needs its code pattern as a quoted string", fix)
        return None
    try:
        pattern = ast.literal_eval(token.string)
    except (ValueError, SyntaxError):
        pattern = None
    if not isinstance(pattern, str):
        context.problem(number, f"the note pattern {token.string} is not a plain string", fix)
        return None
    after = rest[token.end[1] :].lstrip()
    versions: SpecifierSet | None = None
    if scope := _NOTE_SCOPE.match(after):
        try:
            versions = SpecifierSet(scope.group(1))
        except InvalidSpecifier:
            context.problem(
                number,
                f"`[torch {scope.group(1)}]` is not a PEP 440 version specifier",
                'scope a note to torch versions as `note "<code pattern>" [torch >=2.15]: <text>`',
            )
            return None
        after = after[scope.end() :].lstrip()
    if not after.startswith(":") or not after[1:].strip():
        context.problem(number, 'a note is `note "<code pattern>": <text>`: missing `:` or text after the pattern', fix)
        return None
    try:
        pattern_tokens(pattern)
    except PatternError as exc:
        context.problem(
            number,
            f"note pattern `{pattern}` is not Python code: {exc}",
            "copy the code exactly from torch's source",
        )
        return None
    return Note(pattern, after[1:].strip(), number, versions)


register_body_parser("source", source_blocks)
register_body_parser("expect", expect_blocks)
