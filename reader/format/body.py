"""A guide's Markdown body → regions, sybil-style: one parser per fence kind, prose in between.

A fence kind is the first word of a fence's info string (```` ```source prefetch ```` is kind ``source``).
Each kind has at most one parser, registered with `register_body_parser`; fences of unregistered kinds (an
ordinary ```` ```python ```` block) stay prose. So a new kind of block (```` ```predict ````, say) is one
parser and one region dataclass, registered from its own module; nothing here or in ``reader.format.guide`` changes.

Fences are found with markdown-it (CommonMark), once per guide: fences in lists and blockquotes count, fences
in code spans do not.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from markdown_it import MarkdownIt

from reader.format.errors import Problems
from reader.format.guide import Guide, Prose, Region

KIND_RE = re.compile(r"^[^\s`~]+$")


@dataclass(frozen=True)
class Fence:
    """One fenced block of a registered kind, as written."""

    kind: str  # the info string's first word
    args: tuple[str, ...]  # its other words: ```source prefetch → ("prefetch",)
    content: str  # the lines between the fences
    start: int  # the opening fence line
    end: int  # the closing fence line (the body's last line if the fence is never closed)

    @property
    def info(self) -> str:
        return " ".join((self.kind, *self.args))


@dataclass(frozen=True)
class BodyContext:
    """What a parser may consult about the guide, and where it records problems (pinned to lines)."""

    guide: Guide  # the front matter; no regions yet
    anchors: frozenset[str]  # every anchor name declared, valid or not: one bad symbol must not cascade
    problems: Problems

    def problem(self, line: int, message: str, fix: str) -> None:
        self.problems.add(line, message, fix)


# Called once per guide with every fence of its kind, in document order, so it can check across fences
# (duplicate names). It yields one region per fence it accepts; a fence it rejects (after recording why)
# stays prose. Regions must not overlap.
BodyParser = Callable[[Sequence[Fence], BodyContext], Iterable[Region]]


class BodyParsers:
    """The registry: fence kind → parser, in registration order."""

    def __init__(self) -> None:
        self._parsers: dict[str, BodyParser] = {}

    def register(self, kind: str, parser: BodyParser) -> BodyParser:
        if not KIND_RE.match(kind):
            raise ValueError(f"a fence kind is one word (the first of the info string), not {kind!r}")
        if kind in self._parsers:
            raise ValueError(f"a body parser for ```{kind} fences is already registered: {_name(self._parsers[kind])}")
        self._parsers[kind] = parser
        return parser

    def unregister(self, kind: str) -> BodyParser:
        return self._parsers.pop(kind)

    def __contains__(self, kind: object) -> bool:
        return kind in self._parsers

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self._parsers)

    def regions(self, lines: list[str], first_line: int, context: BodyContext) -> list[Region]:
        """The body (``lines``, the first of which is line ``first_line`` of the file) as regions in order, with
        `Prose` for the non-blank text between the parsed fences."""
        fences = list(fences_of(lines, first_line, self._parsers))
        blocks: list[tuple[Region, str]] = []
        for kind, parser in self._parsers.items():
            mine = [f for f in fences if f.kind == kind]
            if mine:
                blocks += [(_checked(region, kind), kind) for region in parser(mine, context)]
        return list(_with_prose(lines, first_line, sorted(blocks, key=lambda b: b[0].start)))


BODY_PARSERS = BodyParsers()


def register_body_parser(kind: str, parser: BodyParser) -> BodyParser:
    """Parse ```` ```<kind> ```` fences of every guide with ``parser``. A kind has one parser: registering it
    again is a `ValueError` (unregister first: ``BODY_PARSERS.unregister(kind)``)."""
    return BODY_PARSERS.register(kind, parser)


def fences_of(lines: list[str], first_line: int, kinds: Iterable[str]) -> Iterator[Fence]:
    """Every fence whose info string starts with one of ``kinds``, in document order."""
    wanted = set(kinds)
    for token in MarkdownIt("commonmark").parse("\n".join(lines)):
        if token.type != "fence" or not token.map:
            continue
        words = token.info.split()
        if words and words[0] in wanted:
            start, stop = token.map
            yield Fence(words[0], tuple(words[1:]), token.content, first_line + start, first_line + stop - 1)


def _checked(region: Region, kind: str) -> Region:
    if not isinstance(region, Region):
        raise TypeError(f"the ```{kind} parser yielded {region!r}, which has no `start` and `end` lines")
    return region


def _with_prose(lines: list[str], first_line: int, blocks: list[tuple[Region, str]]) -> Iterator[Region]:
    cursor = first_line
    for block, kind in blocks:
        if block.start < cursor:
            raise ValueError(f"the ```{kind} parser yielded lines {block.start}-{block.end}, overlapping a region")
        yield from _prose(lines, first_line, cursor, block.start)
        yield block
        cursor = block.end + 1
    yield from _prose(lines, first_line, cursor, first_line + len(lines))


def _prose(lines: list[str], first_line: int, start: int, stop: int) -> Iterator[Prose]:
    """The lines ``start`` up to (not including) ``stop`` as prose, unless they are blank."""
    text = "\n".join(lines[start - first_line : stop - first_line])
    if text.strip():
        yield Prose(start, stop - 1, text)


def _name(parser: BodyParser) -> str:
    return f"{getattr(parser, '__module__', '?')}.{getattr(parser, '__qualname__', repr(parser))}"
