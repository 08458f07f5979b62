"""Classify an anchor's live source against its approved lock entry, and explain the difference.

An anchor scoped to other torch releases (``torch = "<2.15"`` on its table) is not read on this one: its kind says
so, and it passes. Otherwise, most to least severe: cannot resolve (removed / pattern lost) → never approved, or the
guide's anchor was edited since approval → the fingerprints (signature changed, code changed,
annotations-only, cosmetic) → same text at other lines (moved) → unchanged. Note patterns that no longer land
exactly once turn an otherwise passing anchor into "pattern lost", because the guide's annotations would point
at the wrong code.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from enum import StrEnum

from reader.format.guide import AnchorSpec
from reader.gate.lock import ApprovedSource, Lock, LockEntry
from reader.source.anchors import PATTERN_LOST, REMOVED, AnchorError, Resolution


class DriftKind(StrEnum):
    UNCHANGED = "unchanged"
    MOVED = "moved"
    COSMETIC = "cosmetic"
    ANNOTATIONS = "annotations-only"
    CODE = "code changed"
    SIGNATURE = "signature changed"
    REMOVED = REMOVED
    PATTERN_LOST = PATTERN_LOST
    UNAPPROVED = "not yet approved"
    OTHER_TORCH = "not read on this torch"

    @property
    def ok(self) -> bool:
        return self in (DriftKind.UNCHANGED, DriftKind.MOVED, DriftKind.COSMETIC, DriftKind.OTHER_TORCH)


EXPLAIN = {
    DriftKind.UNCHANGED: "the approved source, at the approved lines",
    DriftKind.MOVED: "the approved source, at other lines",
    DriftKind.COSMETIC: "only comments, docstrings or formatting changed",
    DriftKind.ANNOTATIONS: "only type annotations changed",
    DriftKind.CODE: "the code changed",
    DriftKind.SIGNATURE: "the signature changed (parameters, defaults, or a class's bases)",
    DriftKind.REMOVED: "the symbol no longer exists",
    DriftKind.PATTERN_LOST: "a pattern no longer lands on exactly one statement",
    DriftKind.UNAPPROVED: "no approved source to compare with",
    DriftKind.OTHER_TORCH: "the anchor is scoped to other torch releases",
}


@dataclass
class Drift:
    guide_id: str
    anchor: AnchorSpec
    kind: DriftKind
    summary: str  # one line
    approved: ApprovedSource | None = None  # the approved source this torch was compared with
    current: Resolution | None = None
    error: AnchorError | None = None
    diff: str = ""
    problems: list[str] = field(default_factory=list)  # e.g. notes that lost their code

    @property
    def ok(self) -> bool:
        return self.kind.ok

    @property
    def label(self) -> str:
        """``code changed``; ``pattern lost: 2 notes, and code changed`` when notes that no longer land (which
        block approval whatever else changed) come with another change."""
        lost = len(self.problems)
        if not lost or self.kind in (DriftKind.REMOVED, DriftKind.PATTERN_LOST):
            return self.kind.value
        return f"{DriftKind.PATTERN_LOST.value}: {lost} note{'s' * (lost != 1)}, and {self.kind.value}"

    @property
    def key(self) -> str:
        return Lock.key(self.guide_id, self.anchor.name)

    @property
    def relocation(self) -> str | None:
        """``file:a-b → file:c-d`` when the anchor's text now sits elsewhere, for one-line notes."""
        if self.approved is None or self.current is None:
            return None
        old_lines = f"{self.approved.lines[0]}-{self.approved.lines[1]}"
        new_lines = f"{self.current.start}-{self.current.end}"
        if self.approved.file != self.current.relpath:
            return f"{self.approved.file}:{old_lines} → {self.current.relpath}:{new_lines}"
        return None if old_lines == new_lines else f"{self.current.relpath}:{old_lines} → {new_lines}"

    def note(self) -> str:
        """One line for summaries: the class, what it means, and where the code went."""
        moved = f" ({self.relocation})" if self.relocation else ""
        return f"{self.kind.value} — {self.summary}{moved}"


def classify(
    guide_id: str,
    anchor: AnchorSpec,
    *,
    approved: LockEntry | None,
    current: Resolution | AnchorError,
    current_version: str | None,
    lock: Lock | None = None,  # unused: fingerprints come from the approved text (kept for older callers)
) -> Drift:
    entry = approved
    if isinstance(current, AnchorError):
        kind = DriftKind.PATTERN_LOST if current.kind == PATTERN_LOST else DriftKind.REMOVED
        was = entry.for_version(current_version) if entry is not None else None
        return Drift(guide_id, anchor, kind, current.message, was, None, current)
    if entry is None:
        summary = f"`{anchor.symbol}` has never been approved for this guide"
        return Drift(guide_id, anchor, DriftKind.UNAPPROVED, summary, None, current)
    compared = compared_source(entry, current, current_version)
    diff = unified_diff(compared, current, current_version)
    if (entry.symbol, entry.pattern) != (anchor.symbol, anchor.pattern):
        was = entry.symbol + (f" (pattern `{entry.pattern}`)" if entry.pattern else "")
        summary = f"the guide's anchor changed since approval (was {was})"
        return Drift(guide_id, anchor, DriftKind.UNAPPROVED, summary, compared, current, diff=diff)
    kind = _kind(compared, current)
    summary = EXPLAIN[kind]
    if len(entry.sources) > 1 and not kind.ok:
        versions = "; ".join(", ".join(s.approved_on) for s in entry.sources)
        summary += (
            f"; this torch ({current_version or '?'}) matches none of the {len(entry.sources)} sources approved "
            f"(torch {versions}), compared with torch {', '.join(compared.approved_on)}'s"
        )
    return Drift(guide_id, anchor, kind, summary, compared, current, diff=diff if kind is not DriftKind.MOVED else "")


def _kind(approved: ApprovedSource, current: Resolution) -> DriftKind:
    old, new = approved.fingerprints, current.fingerprints
    moved = (approved.file, approved.lines) != (current.relpath, (current.start, current.end))
    if old.exact == new.exact:
        return DriftKind.MOVED if moved else DriftKind.UNCHANGED
    if old.cosmetic_to(new):
        return DriftKind.COSMETIC
    if old.normalized == new.normalized:
        return DriftKind.ANNOTATIONS
    return DriftKind.SIGNATURE if old.signature != new.signature else DriftKind.CODE


def compared_source(entry: LockEntry, current: Resolution, version: str | None) -> ApprovedSource:
    """Of an anchor's approved sources (one per release of a matrix where the code differs), the one this run is
    judged against: the one whose text it has (exactly, then up to comments and formatting), else the one its
    release reads (the nearest older approval)."""
    for source in entry.sources:
        if source.fingerprints.exact == current.fingerprints.exact:
            return source
    for source in entry.sources:
        if source.fingerprints.cosmetic_to(current.fingerprints):
            return source
    return entry.for_version(version)


def other_torch(guide_id: str, anchor: AnchorSpec, current_version: str | None) -> Drift:
    """An anchor scoped to other releases, on this one: not resolved, not compared, not approved here."""
    summary = f"reads torch {anchor.torch}; this torch is {current_version}"
    return Drift(guide_id, anchor, DriftKind.OTHER_TORCH, summary)


def unified_diff(approved: ApprovedSource, current: Resolution, current_version: str | None) -> str:
    """approved → current, with hunk headers in real torch line numbers so they can be looked up."""
    first, last = approved.lines
    old_label = f"approved {approved.file}:{first}-{last} (torch {', '.join(approved.approved_on)})"
    new_label = f"current  {current.relpath}:{current.start}-{current.end} (torch {current_version or '?'})"
    lines = list(
        difflib.unified_diff(
            approved.source.splitlines(keepends=True),
            current.text.splitlines(keepends=True),
            old_label,
            new_label,
            n=3,
        )
    )
    return "".join(_shift_hunk(line, approved.lines[0] - 1, current.start - 1) for line in lines)


_HUNK = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


def _shift_hunk(line: str, old_offset: int, new_offset: int) -> str:
    match = _HUNK.match(line)
    if not match:
        return line if line.endswith("\n") else line + "\n"
    old_start, old_len, new_start, new_len = match.groups()
    return (
        f"@@ -{int(old_start) + old_offset}{old_len or ''} +{int(new_start) + new_offset}{new_len or ''} @@"
        + line[match.end() :]
    )
