"""One drifted anchor, worded once: what changed, where, the problems and hints, the diff, and how to approve.

Three places show a drift: pytest's failure of the anchor item (``pytest_plugin.failures``), the terminal report
of ``fsdp-readings drift`` / ``approve`` (`drift_panel`), and the site's page, on the quote that drifted. Each draws
`DriftView.lines`: plain text with a style name per line, so the three say the same words and only the ink differs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.rule import Rule
from rich.text import Text

from reader.gate.drift import Drift, DriftKind
from reader.gate.report import AnchorRow, GuideReport, approve_commands

# A line's style, named as rich names it; `TERMINAL_MARKUP` says how pytest's terminal writer inks each one.
HEADING, PROBLEM, HINT, REFUSAL, COMMAND, ADDED, REMOVED, HUNK = (
    "bold red", "yellow", "cyan", "red", "bold", "green", "red", "cyan"
)  # fmt: skip
TERMINAL_MARKUP: dict[str, dict[str, bool]] = {
    "": {},
    "bold red": {"red": True, "bold": True},
    "yellow": {"yellow": True},
    "cyan": {"cyan": True},
    "red": {"red": True},
    "bold": {"bold": True},
    "green": {"green": True},
}


@dataclass(frozen=True)
class DriftView:
    where: str  # the anchor's line in the guide, "readings/04-....md:8"
    guide_id: str
    guide_path: str  # the guide's path as messages show it
    anchor: str
    symbol: str
    drift: Drift
    approving: bool = False  # shown while approving: the anchor is "not approved" rather than "drifted"
    refused: tuple[str, ...] = ()  # why the guide was not approved (nothing of it was recorded)

    def lines(self) -> Iterator[tuple[str, str]]:
        """(text, style) per line: the words every view of this drift shows."""
        drift = self.drift
        verb = "not approved" if self.approving else "drifted"
        yield f"{self.where}: anchor `{self.anchor}` ({self.symbol}) {verb}: {drift.label}", HEADING
        yield f"  {drift.summary}", ""
        if drift.approved is not None:
            a = drift.approved
            yield f"  approved: {a.file}:{a.lines[0]}-{a.lines[1]} (torch {', '.join(a.approved_on)})", ""
        if drift.current is not None:
            yield f"  current:  {drift.current.location}-{drift.current.end}", ""
        elif drift.error is not None and drift.error.where:
            yield f"  current:  {drift.error.where}", ""
        for problem in drift.problems:
            yield f"  {problem}", PROBLEM
        for hint in drift.error.hints if drift.error else []:
            yield f"  hint: {hint}", HINT
        if self.refused:
            yield f"  nothing of {self.guide_id} was recorded:", REFUSAL
            for reason in self.refused:
                yield f"    {reason}", REFUSAL
        if drift.diff:
            yield "", ""
            for line in drift.diff.rstrip("\n").split("\n"):
                yield line, _diff_style(line)
        yield "", ""
        if drift.problems or drift.kind in (DriftKind.REMOVED, DriftKind.PATTERN_LOST):
            yield f"  fix the anchor at {self.where} (or the notes above), re-read the guide, then approve:", ""
        elif drift.kind is DriftKind.UNAPPROVED:
            yield "  read the guide against this source, then approve it:", ""
        else:
            yield "  re-read the guide against the new source, then approve it:", ""
        for command in approve_commands(self.guide_id, self.guide_path):
            yield f"    {command}", COMMAND

    def __str__(self) -> str:
        return "\n".join(text for text, _ in self.lines())

    def renderable(self) -> RenderableType:
        """Under a rule naming the guide and the anchor. Lines are never wrapped (``no_wrap`` and
        ``overflow="ignore"``): paths, diffs and commands stay copy-pasteable and greppable in CI logs."""
        texts = [Text(text, style=style, no_wrap=True, overflow="ignore") for text, style in self.lines()]
        title = Text(f"{self.guide_id} · anchor {self.anchor} · {self.symbol}", style="bold")
        return Group(Rule(title, align="left", style="red"), *texts)


def _diff_style(line: str) -> str:
    if line.startswith(("---", "+++")):
        return "bold"
    if line.startswith("@@"):
        return HUNK
    return {"-": REMOVED, "+": ADDED}.get(line[:1], "")


def drift_panel(guide: GuideReport, row: AnchorRow) -> RenderableType:
    """One drifted anchor of a session report, in the terminal: its view under a rule, then a blank line."""
    assert row.drift is not None
    view = DriftView(f"{guide.path}:{row.line}", guide.id, guide.path, row.name, row.symbol, row.drift)
    return Group(view.renderable(), Text(""))
