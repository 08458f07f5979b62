"""A ``source`` block resolved for reading: the live lines of its anchor, cut into segments after the lines its
notes pin, each note placed under the last line its pattern covers, and the anchor's drift on this torch.

`quote` is the one place that decides what a quote shows. ``show`` (`reader.views.guide.source_panel`) and the
site's pages (`reader.site`) both render from it, so the terminal and the page cannot disagree about which lines
are quoted, where a note lands or whether the anchor drifted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from reader.format.guide import Guide, Note, SourceBlock
from reader.gate.drift import Drift
from reader.gate.workspace import Workspace
from reader.source.anchors import AnchorError, NoteMatch, Resolution
from reader.source.patterns import find

OK_DRIFT = frozenset({"unchanged", "moved", "cosmetic"})  # drift kinds a reader need not re-read for


@dataclass(frozen=True)
class PinnedNote:
    """A note with where it landed: ``match.line`` to ``last`` are the file lines its pattern covers (what the
    label cites and the quote marks), ``after`` the line the note is shown under (see `pin_notes`)."""

    note: Note
    match: NoteMatch
    after: int
    last: int = 0  # the last line the pattern covers; 0 when it is not pinned

    @property
    def pinned(self) -> bool:
        return self.match.count == 1

    @property
    def lines(self) -> range:
        return range(self.match.line, max(self.last, self.match.line) + 1) if self.pinned else range(0)

    @property
    def label(self) -> str:
        if self.pinned:
            first, last = self.lines[0], self.lines[-1]
            return f"L{first} ▸" if first == last else f"L{first}–{last} ▸"
        return "not found ▸" if self.match.count == 0 else f"×{self.match.count} ▸"


def pin_notes(block_notes: Sequence[Note], found: Resolution, matches: Sequence[NoteMatch]) -> list[PinnedNote]:
    """The block's notes in the order they are shown: pinned ones by line (ties in note order), each placed
    after the last line its pattern covers, but never before a note of an earlier line (so the notes read in
    line order even when a multi-line match encloses the next note's line); then, in note order, the ones
    that land nowhere or in several places."""
    pinned: list[tuple[int, int, Note, NoteMatch, int]] = []
    lost: list[PinnedNote] = []
    for index, (note, match) in enumerate(zip(block_notes, matches, strict=True)):
        if match.count != 1:
            lost.append(PinnedNote(note, match, found.end))
            continue
        (only,) = find(found.text, note.pattern)
        pinned.append((match.line, index, note, match, found.start + only.end[0] - 1))
    shown: list[PinnedNote] = []
    after = found.start
    for line, _, note, match, last in sorted(pinned, key=lambda p: (p[0], p[1])):
        after = min(max(after, line, last), found.end)
        shown.append(PinnedNote(note, match, after, last))
    return shown + lost


_BANNER_RULE = re.compile(r"^\s*#{3,}\s*$")
_COMMENT = re.compile(r"^\s*#")


def shown_start(found: Resolution) -> int:
    """The first line a quote shows: the anchor's, unless it opens with a section banner (a comment boxed by rows
    of ``#``, such as ``# INITIALIZATION #`` above ``FlatParamHandle.__init__``). The banner heads the section of
    the file the definition opens, not the definition, though the index counts it among its comments."""
    lines = found.text.split("\n")
    if not lines or not _BANNER_RULE.match(lines[0]):
        return found.start
    for offset, line in enumerate(lines[1:], start=1):
        if _BANNER_RULE.match(line):
            return found.start + offset + 1 if offset + 1 < len(lines) else found.start
        if not _COMMENT.match(line):
            return found.start
    return found.start


@dataclass(frozen=True)
class Segment:
    """File lines ``first``..``last`` of the quote, then the pinned notes shown under ``last`` (none for the tail
    after the last note)."""

    first: int
    last: int
    notes: tuple[PinnedNote, ...]


@dataclass(frozen=True)
class Quote:
    name: str  # the anchor's name in the guide
    symbol: str
    location: str  # torch/distributed/fsdp/<file>.py:<first>-<last>, relative to the directory holding torch/
    qualname: str
    status: str  # the drift kind against the lock: unchanged, moved, cosmetic, changed, ...
    found: Resolution
    segments: tuple[Segment, ...]
    lost: tuple[PinnedNote, ...]  # notes whose pattern lands nowhere or in several places
    drift: Drift | None = None  # the anchor against the lock on this torch (what a page says of a drifted quote)

    @property
    def ok(self) -> bool:
        """Whether the code reads as approved (else the page and ``show`` mark it for re-reading)."""
        return self.status in OK_DRIFT

    @property
    def highlighted(self) -> frozenset[int]:
        return frozenset(line for s in self.segments for p in s.notes for line in p.lines)

    @property
    def first(self) -> int:
        return self.segments[0].first if self.segments else self.found.start


@dataclass(frozen=True)
class BrokenQuote:
    """An anchor that does not resolve on this torch: its symbol and why."""

    name: str
    symbol: str
    error: AnchorError


def quote(guide: Guide, block: SourceBlock, workspace: Workspace) -> Quote | BrokenQuote:
    """``block`` of ``guide`` (as read on the workspace's torch) resolved against the workspace's torch."""
    anchor = guide.anchor(block.anchor)
    found = workspace.current(anchor)
    if isinstance(found, AnchorError):
        return BrokenQuote(anchor.name, anchor.symbol, found)
    shown_notes = block.notes_for(workspace.torch_version)
    matches = workspace.resolver.notes(found, [note.pattern for note in shown_notes])
    notes = pin_notes(shown_notes, found, matches)
    segments: list[Segment] = []
    first = start = shown_start(found)
    for after in sorted({p.after for p in notes if p.pinned}):
        segments.append(Segment(first, after, tuple(p for p in notes if p.pinned and p.after == after)))
        first = after + 1
    if first <= found.end:
        segments.append(Segment(first, found.end, ()))
    drift = workspace.drift(guide, anchor)
    status = drift.kind.value
    location = f"{found.relpath}:{start}-{found.end}"
    lost = tuple(p for p in notes if not p.pinned)
    return Quote(anchor.name, anchor.symbol, location, anchor.qualname or anchor.symbol, status, found,
                 tuple(segments), lost, drift)  # fmt: skip
