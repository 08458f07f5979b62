"""What a session found, as data (the JSON half of the drift report a CI job posts; the Markdown half is
`reader.gate.drift_report`) and as rich renderables.

The plugin and the CLI fill a ``SessionReport``; renderers are small functions returning rich renderables that
the caller prints to whatever console it has (pytest's terminal writer, or stdout).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from reader.format.guide import AnchorSpec, Guide
from reader.gate.drift import Drift, DriftKind


def approve_commands(guide_id: str, guide_path: str) -> list[str]:
    return [f"pytest {guide_path} --approve={guide_id}", f"fsdp-readings approve {guide_id}"]


@dataclass
class AnchorRow:
    name: str
    symbol: str
    outcome: str  # "passed" | "failed" | "skipped" | "approved"
    drift: Drift | None = None
    message: str = ""
    quoted_at: tuple[int, ...] = ()  # guide lines of the ```source fences that quote this anchor
    notes_at: tuple[int, ...] = ()  # guide lines of the notes pinned to its code
    claims: tuple[str, ...] = ()  # claims that name it as their runtime evidence

    @property
    def kind(self) -> str | None:
        return self.drift.kind.value if self.drift is not None else None


def anchor_row(guide: Guide, anchor: AnchorSpec, outcome: str, drift: Drift | None, message: str = "") -> AnchorRow:
    """A report row with where the guide relies on the anchor, so a reviewer knows which lines to re-read."""
    blocks = guide.source_blocks(anchor.name)
    return AnchorRow(
        anchor.name,
        anchor.symbol,
        outcome,
        drift,
        message,
        quoted_at=tuple(b.start for b in blocks),
        notes_at=tuple(n.line for b in blocks for n in b.notes),
        claims=tuple(c.id for c in guide.claims if anchor.name in c.evidence),
    )


@dataclass
class ClaimRow:
    id: str
    statement: str
    outcome: str  # "passed" | "failed" | "skipped" | "xfailed" | "xpassed"
    message: str = ""  # the first line of a failure, the reason of a skip or of an xfail
    reason: str | None = None  # a failed check's `Violation` reason (None: it raised something else)
    line: int = 0  # the claim's line in the guide


@dataclass
class GuideReport:
    id: str
    path: str
    title: str
    anchors: list[AnchorRow] = field(default_factory=list)
    claims: list[ClaimRow] = field(default_factory=list)

    def count(self, rows: list[AnchorRow] | list[ClaimRow], outcome: str) -> int:
        return sum(1 for r in rows if r.outcome == outcome)

    @property
    def claims_held(self) -> int:
        """Claims that passed, or failed exactly as their xfail expects."""
        return sum(1 for c in self.claims if c.outcome in ("passed", "xfailed", "xpassed"))


def expected_failures(report: SessionReport) -> list[str]:
    """One line per xfail claim that ran: its guide, its id, what happened and what its xfail says."""
    return [
        f"{g.id}/{c.id}: {c.outcome}: {c.message}"
        for g in report.guides
        for c in g.claims
        if c.outcome in ("xfailed", "xpassed")
    ]


@dataclass
class SessionReport:
    torch_version: str | None
    torch_git: str | None
    source: str  # "installed at ..." / "wheel at ..."
    lock: str
    guides: list[GuideReport] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)  # rendered problems of guides that did not collect
    approved: list[str] = field(default_factory=list)  # "guide/anchor (was: kind)", "guide on torch R: claims"
    refused: list[str] = field(default_factory=list)  # "guide: why it was not approved" (nothing of it recorded)
    exit_code: int | None = None

    def guide(self, guide_id: str, path: str, title: str) -> GuideReport:
        for found in self.guides:
            if found.id == guide_id:
                return found
        created = GuideReport(guide_id, path, title)
        self.guides.append(created)
        return created

    @property
    def drifted(self) -> list[AnchorRow]:
        return [a for g in self.guides for a in g.anchors if a.outcome == "failed"]

    def to_json(self) -> dict[str, object]:
        return {
            "torch": {"version": self.torch_version, "git_version": self.torch_git, "source": self.source},
            "lock": self.lock,
            "exit_code": self.exit_code,
            "broken_input": self.broken,
            "approved": self.approved,
            "refused": self.refused,
            "guides": [
                {
                    "id": g.id,
                    "path": g.path,
                    "title": g.title,
                    "anchors": [_anchor_json(a, g) for a in g.anchors],
                    "claims": [
                        {
                            "id": c.id,
                            "statement": c.statement,
                            "outcome": c.outcome,
                            "message": c.message,
                            "reason": c.reason,
                            "line": c.line,
                        }
                        for c in g.claims
                    ],
                }
                for g in self.guides
            ],
        }


def _anchor_json(row: AnchorRow, guide: GuideReport) -> dict[str, object]:
    drift = row.drift
    data: dict[str, object] = {
        "name": row.name,
        "symbol": row.symbol,
        "outcome": row.outcome,
        "drift": row.kind,
        "message": row.message,
        "quoted_at": list(row.quoted_at),
        "notes_at": list(row.notes_at),
        "claims": list(row.claims),
    }
    if drift is not None:
        data["summary"] = drift.summary
        data["problems"] = drift.problems
        data["hints"] = drift.error.hints if drift.error else []
        if drift.approved is not None:
            data["approved"] = {
                "file": drift.approved.file,
                "lines": list(drift.approved.lines),
                "torch": list(drift.approved.approved_on),
            }
        if drift.current is not None:
            data["current"] = {
                "file": drift.current.relpath,
                "lines": [drift.current.start, drift.current.end],
                "location": drift.current.location,
            }
        data["diff"] = drift.diff
        if not drift.ok:
            data["approve"] = approve_commands(guide.id, guide.path)
    return data


# --- rich ---------------------------------------------------------------------------------------------------


def summary(report: SessionReport, *, claims: bool = True) -> RenderableType:
    """Per guide: anchors ok/drifted and (when claims ran, i.e. under pytest) claims passed/failed/skipped."""
    git = f" (git {report.torch_git[:12]})" if report.torch_git else ""
    heading = Text.assemble(
        ("torch ", "bold"), (f"{report.torch_version or '?'}", "bold"), f"{git} · ", (report.source, "dim")
    )
    heading.no_wrap, heading.overflow = True, "ignore"  # the path is read and copied whole
    rows = []
    for g in report.guides:
        ok = sum(1 for a in g.anchors if a.outcome in ("passed", "approved"))
        cells = [Text(str(ok)), _num(g.count(g.anchors, "failed"), "red")]
        if claims:
            cells += [
                _num(g.claims_held, "green"),
                _num(g.count(g.claims, "failed"), "red"),
                _num(g.count(g.claims, "skipped"), "yellow"),
            ]
        rows.append((g.id, cells))
    heads = ("anchors", "drifted", "claims", "failed", "skipped")[: 5 if claims else 2]
    table = SummaryTable(heads, rows)
    legend = "anchors: unchanged or approved · drifted: to re-read"
    legend += " · claims: held (passed, or failed as their xfail expects)" if claims else ""
    parts: list[RenderableType] = [heading, Text(legend, style="dim"), table]
    notes = [
        f"{g.id}/{a.name}: {a.drift.note()}"
        for g in report.guides
        for a in g.anchors
        if a.outcome == "passed" and a.drift is not None and a.drift.kind in (DriftKind.MOVED, DriftKind.COSMETIC)
    ]
    if claims and (xfails := expected_failures(report)):
        parts.append(Text("expected failures (known torch bugs; counted as claims ok):", style="bold"))
        parts += [Text(f"  {line}", style="cyan") for line in xfails]
    if notes:
        parts.append(Text("notes (passing; approve to record them):", style="bold"))
        parts += [Text(f"  {n}", style="cyan") for n in notes]
    if report.approved:
        parts.append(Text(f"approved into {report.lock}:", style="bold green"))
        parts += [Text(f"  {a}", style="green") for a in report.approved]
    if report.refused:
        parts.append(Text("not approved (nothing of these guides was recorded):", style="bold red"))
        parts += [Text(f"  {r}", style="red") for r in report.refused]
    if report.broken:
        parts.append(Text(f"broken input (exit code 2): {len(report.broken)}", style="bold red"))
        parts += [Text(f"  {problem.splitlines()[0]}", style="red") for problem in report.broken]
    return Group(*parts)


@dataclass(frozen=True)
class SummaryTable:
    """Counts per guide: a table where it fits whole, else a line per guide with each count named. Guide ids are
    what a person acts on (``--approve=<id>``): never cut, never folded; neither are the headers."""

    heads: tuple[str, ...]
    rows: list[tuple[str, list[Text]]]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        id_width = max((len(guide_id) for guide_id, _ in self.rows), default=5)
        needed = id_width + sum(max(len(h), 3) for h in self.heads) + 2 * len(self.heads)
        if needed <= options.max_width:
            table = Table(box=box.SIMPLE_HEAD, expand=False, pad_edge=False, collapse_padding=True)
            table.add_column("guide", no_wrap=True, min_width=id_width)
            for head in self.heads:
                table.add_column(head, justify="right", no_wrap=True)
            for guide_id, cells in self.rows:
                table.add_row(guide_id, *cells)
            yield table
            return
        for guide_id, cells in self.rows:
            counts = Text("  ")
            for i, (head, cell) in enumerate(zip(self.heads, cells, strict=True)):
                counts.append_text(Text.assemble(", " if i else "", cell, f" {head}"))
            yield Text(guide_id, style="bold")
            yield counts


def drift_panel(guide: GuideReport, row: AnchorRow) -> RenderableType:
    """One drifted anchor: what changed, where, the diff, and how to approve.

    Lines are never wrapped (``no_wrap`` + ``overflow="ignore"``): paths, diffs and commands must stay
    copy-pasteable and greppable in CI logs.
    """
    drift = row.drift
    assert drift is not None
    lines = [Text(f"{drift.kind.value}: {drift.summary}", style="bold red")]
    if drift.approved is not None:
        a = drift.approved
        lines.append(Text(f"approved: {a.file}:{a.lines[0]}-{a.lines[1]} (torch {', '.join(a.approved_on)})"))
    if drift.current is not None:
        lines.append(Text(f"current:  {drift.current.location}-{drift.current.end}"))
    lines += [Text(p, style="yellow") for p in drift.problems]
    lines += [Text(f"hint: {h}", style="cyan") for h in (drift.error.hints if drift.error else [])]
    if drift.diff:
        lines.append(Text(""))
        lines += [Text(line, style=_diff_style(line)) for line in drift.diff.rstrip("\n").split("\n")]
    if drift.kind is not DriftKind.REMOVED:
        lines.append(Text("re-read the guide against this source, then approve it:", style="bold"))
        lines += [Text(f"  {command}", style="bold") for command in approve_commands(guide.id, guide.path)]
    for line in lines:
        line.no_wrap = True
        line.overflow = "ignore"
    title = Text(f"{guide.id} · anchor {row.name} · {row.symbol}", style="bold")
    return Group(Rule(title, align="left", style="red"), *lines, Text(""))


def _diff_style(line: str) -> str:
    if line.startswith(("---", "+++")):
        return "bold"
    if line.startswith("@@"):
        return "cyan"
    return {"-": "red", "+": "green"}.get(line[:1], "")


def _num(value: int, style: str) -> Text:
    return Text(str(value), style=style if value else "dim")
