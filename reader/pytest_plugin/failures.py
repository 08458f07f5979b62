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
from reader.gate.drift import Drift
from reader.gate.lock import LockError
from reader.views.drift import TERMINAL_MARKUP, DriftView

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

    @property
    def view(self) -> DriftView:
        return DriftView(self.where, self.guide_id, self.display_path, self.anchor.name, self.anchor.symbol, self.drift,
                         self.approving, self.refused)  # fmt: skip

    def lines(self) -> Iterator[tuple[str, dict[str, bool]]]:
        """The drift's words (`reader.views.drift`), each with the terminal writer's markup for its style."""
        for text, style in self.view.lines():
            yield text, TERMINAL_MARKUP[style]

    def toterminal(self, tw: TerminalWriter) -> None:
        for text, markup in self.lines():
            tw.line(text, **markup)

    def __str__(self) -> str:
        return "\n".join(text for text, _ in self.lines())
