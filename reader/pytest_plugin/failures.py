"""How guide items fail in pytest: the exceptions they raise and the text (or terminal repr) pytest shows.

A guide item's failure is about the guide or torch, not about the reader's code, so it is shown without a
traceback and points at the guide's own lines. A claim's own failure text is decided with its verdict
(`reader.claims.verdict`, in the words of `reader.claims.text`); this module carries it to pytest, and words
what only pytest shows: an anchor's drift (`DriftRepr`) and a malformed lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from reader.format.guide import AnchorSpec
from reader.gate.drift import Drift, DriftKind
from reader.gate.lock import LockError
from reader.gate.report import approve_commands

if TYPE_CHECKING:
    from _pytest._io import TerminalWriter


class ItemProblem(Exception):
    """A failure whose message is the whole report (no traceback: the problem is in the guide or torch, not
    here)."""


class AnchorDrifted(ItemProblem):
    def __init__(self, drift: Drift, approving: bool, refused: tuple[str, ...] = ()) -> None:
        self.drift = drift
        self.approving = approving
        self.refused = refused  # why its guide was not approved
        super().__init__(drift.summary)


class ClaimFailed(ItemProblem):
    pass


def malformed_lock(display_path: str, exc: LockError) -> str:
    return (
        f"{display_path}:{exc.line}: malformed lock: {exc.message}\n"
        "    fix: restore it from version control, or delete the broken entry and re-approve"
    )


@dataclass
class DriftRepr:
    """The failure of an anchor item: class, locations, problems, hints, colored diff, approve command.

    Duck-typed like pytest's own reprs (reports call ``toterminal`` when it exists and ``str`` otherwise), so
    no private pytest class is needed at run time.
    """

    where: str  # the anchor's line in the guide, "readings/04-....md:8"
    display_path: str  # the guide's path as messages show it
    guide_id: str
    anchor: AnchorSpec
    drift: Drift
    approving: bool
    refused: tuple[str, ...] = ()  # why the guide was not approved (nothing of it was recorded)

    def lines(self) -> Iterator[tuple[str, dict[str, bool]]]:
        drift, anchor = self.drift, self.anchor
        verb = "not approved" if self.approving else "drifted"
        yield (
            f"{self.where}: anchor `{anchor.name}` ({anchor.symbol}) {verb}: {drift.kind.value}",
            {"red": True, "bold": True},
        )
        yield f"  {drift.summary}", {}
        if drift.approved is not None:
            a = drift.approved
            yield f"  approved: {a.file}:{a.lines[0]}-{a.lines[1]} (torch {', '.join(a.approved_on)})", {}
        if drift.current is not None:
            yield f"  current:  {drift.current.location}-{drift.current.end}", {}
        elif drift.error is not None and drift.error.where:
            yield f"  current:  {drift.error.where}", {}
        for problem in drift.problems:
            yield f"  {problem}", {"yellow": True}
        for hint in drift.error.hints if drift.error else []:
            yield f"  hint: {hint}", {"cyan": True}
        if self.refused:
            yield f"  nothing of {self.guide_id} was recorded:", {"red": True}
            for reason in self.refused:
                yield f"    {reason}", {"red": True}
        if drift.diff:
            yield "", {}
            for line in drift.diff.rstrip("\n").split("\n"):
                added, removed = (
                    line.startswith("+") and not line.startswith("+++"),
                    line.startswith("-") and not line.startswith("---"),
                )
                yield line, {"green": added, "red": removed, "cyan": line.startswith("@@")}
        yield "", {}
        if drift.kind in (DriftKind.REMOVED, DriftKind.PATTERN_LOST):
            yield f"  fix the anchor at {self.where} (or the notes above), re-read the guide, then approve:", {}
        elif drift.kind is DriftKind.UNAPPROVED:
            yield "  read the guide against this source, then approve it:", {}
        else:
            yield "  re-read the guide against the new source, then approve it:", {}
        for command in approve_commands(self.guide_id, self.display_path):
            yield f"    {command}", {"bold": True}

    def toterminal(self, tw: TerminalWriter) -> None:
        for text, markup in self.lines():
            tw.line(text, **markup)

    def __str__(self) -> str:
        return "\n".join(text for text, _ in self.lines())
