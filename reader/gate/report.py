"""What a session found, as data (the JSON half of the drift report a CI job posts; the Markdown half is
`reader.gate.drift_report`) and as rich renderables.

The plugin and the CLI fill a ``SessionReport``; renderers are small functions returning rich renderables that
the caller prints to whatever console it has (pytest's terminal writer, or stdout).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from reader.claims.status import Status
from reader.format.guide import AnchorSpec, ClaimSpec, ExpectBlockUnavailable, Guide, block_reference
from reader.gate.drift import Drift, DriftKind

if TYPE_CHECKING:
    from reader.claims.verdict import ClaimVerdict


def approve_commands(guide_id: str, guide_path: str) -> list[str]:
    return [f"pytest {guide_path} --approve={guide_id}", f"fsdp-readings approve {guide_id}"]


@dataclass
class AnchorRow:
    name: str
    symbol: str
    outcome: Status  # PASSED, FAILED, SKIPPED or APPROVED
    drift: Drift | None = None
    message: str = ""
    quoted_at: tuple[int, ...] = ()  # guide lines of the ```source fences that quote this anchor
    notes_at: tuple[int, ...] = ()  # guide lines of the notes pinned to its code
    claims: tuple[str, ...] = ()  # claims that name it as their runtime evidence
    line: int = 0  # the anchor's own line in the guide (its ``[[anchors]]`` entry)

    def __post_init__(self) -> None:
        self.outcome = Status(self.outcome)  # also when given as its text

    @property
    def lost_notes(self) -> list[str]:
        """The guide's notes that no longer land once in the code: they block approval until repinned."""
        return list(self.drift.problems) if self.drift is not None else []

    @property
    def kind(self) -> str | None:
        """The class a reviewer acts on. Lost notes block approval whatever else changed, so an anchor whose code
        changed and whose notes no longer land is "pattern lost" (its code change is `also`)."""
        if self.drift is None:
            return None
        if self.lost_notes and self.drift.kind not in (DriftKind.REMOVED, DriftKind.PATTERN_LOST):
            return DriftKind.PATTERN_LOST.value
        return self.drift.kind.value

    @property
    def also(self) -> str | None:
        """What else changed in an anchor whose lost notes make it "pattern lost" (e.g. "code changed")."""
        if self.drift is None or self.kind == self.drift.kind.value:
            return None
        return self.drift.kind.value

    @property
    def label(self) -> str:
        """``code changed``; ``pattern lost: 2 notes, and code changed`` when notes block its approval."""
        return self.drift.label if self.drift is not None else "?"


def anchor_row(guide: Guide, anchor: AnchorSpec, outcome: Status, drift: Drift | None, message: str = "") -> AnchorRow:
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
        line=anchor.line,
    )


@dataclass(frozen=True)
class ExpectRow:
    line: int  # its line in the guide
    text: str


@dataclass(frozen=True)
class ExpectPointer:
    """The ```` ```expect ```` block a failed claim was checked against, and the rows its `Violation` names: the
    guide's own sentences that are now false."""

    block: str
    line: int  # the fence's line
    rows: tuple[ExpectRow, ...] = ()  # the rows the failure names; empty when it names none of them

    @property
    def at(self) -> int:
        return self.rows[0].line if self.rows else self.line

    def to_json(self) -> dict[str, object]:
        return {"block": self.block, "line": self.line, "rows": [{"line": r.line, "text": r.text} for r in self.rows]}


def expect_pointer(
    guide: Guide, claim: ClaimSpec, recorded: Sequence[Mapping[str, Any]], failed: bool = True
) -> ExpectPointer | None:
    """Where in the guide a failed claim's expected values are written, if they come from an expect block
    (``kwargs = { expected = { expect = "precision" } }``): the rows its `Violation` recorded as now false
    (``recorded``: `checks.expected.Expected.fail` puts ``{"block", "line", "key"}`` there, the line the parser
    read), else the block's fence. ``guide`` is read on the torch the claim ran on (`Guide.on`), so the block is
    the one that torch reads; a recorded line that is not a row of it is not named."""
    names = [name for value in claim.kwargs.values() if (name := block_reference(value)) is not None]
    if not names or not failed:
        return None
    try:
        blocks = guide.expect_blocks(guide.read_on)
    except ExpectBlockUnavailable:
        return None
    lines = guide.text.split("\n")
    pointers = []
    for name in names:
        block = blocks.get(name)
        if block is None:
            continue
        rows = {row.line for row in block.expected} if block.expected is not None else set()
        named = sorted({r["line"] for r in recorded if r.get("block") == name and r.get("line") in rows})
        found = tuple(ExpectRow(n, lines[n - 1].strip()) for n in named)
        pointers.append(ExpectPointer(name, block.start, found))
    return max(pointers, key=lambda p: len(p.rows), default=None)  # the block whose rows it names, if any


@dataclass
class ClaimRow:
    id: str
    statement: str
    outcome: Status  # a claim's: never APPROVED
    message: str = ""  # the verdict's summary: a failure's finding, the reason of a skip or what an xfail says
    reason: str | None = None  # a failed claim's reason (the `Violation`'s, or the verdict's own); None otherwise
    line: int = 0  # the claim's line in the guide
    expect: ExpectPointer | None = None  # a failed claim's expect rows that are now false
    ran: bool = True  # False: it failed without running (its anchors did not resolve, or no rank pool)
    blocked: bool = False  # it did not run because anchors of its guide no longer resolve: drift, not behaviour

    def __post_init__(self) -> None:
        self.outcome = Status(self.outcome)  # also when given as its text

    @classmethod
    def of(cls, claim: ClaimSpec, verdict: ClaimVerdict) -> ClaimRow:
        """The row of ``claim`` as its verdict has it (where its guide is now wrong is added by the caller, which
        has the guide on the torch it ran on: `expect_pointer`)."""
        failed = verdict.status is Status.FAILED
        ran = not (failed and verdict.decided and verdict.outcome is None)
        return cls(claim.id, claim.statement, verdict.status, verdict.summary, verdict.reason if failed else None,
                   line=claim.line, ran=ran)  # fmt: skip

    @property
    def at(self) -> int:
        """The guide line a reviewer fixes: the expect row that is now false, else the claim itself."""
        return self.expect.at if self.expect is not None else self.line


@dataclass
class GuideReport:
    id: str
    path: str
    title: str
    anchors: list[AnchorRow] = field(default_factory=list)
    claims: list[ClaimRow] = field(default_factory=list)

    def count(self, rows: list[AnchorRow] | list[ClaimRow], outcome: Status) -> int:
        return sum(1 for r in rows if r.outcome == outcome)

    @property
    def claims_held(self) -> int:
        """Claims that passed, or failed exactly as their xfail expects."""
        return sum(1 for c in self.claims if c.outcome.held)


def expected_failures(report: SessionReport) -> list[str]:
    """One line per xfail claim that ran: its guide, its id, what happened and what its xfail says."""
    return [
        f"{g.id}/{c.id}: {c.outcome}: {c.message}"
        for g in report.guides
        for c in g.claims
        if c.outcome in (Status.XFAILED, Status.XPASSED)
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
    other_failures: list[str] = field(default_factory=list)  # "nodeid: first line" of failed non-claim items
    claims_not_run: str | None = None  # why no claim ran (a preview, `fsdp-readings drift`); None: they ran
    outcome: str | None = None  # `reader.gate.outcome.Outcome`'s value, once the session is judged
    fail_on: str = "re-read"  # the least severe outcome that fails the run (``--fail-on``)
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
        return [a for g in self.guides for a in g.anchors if a.outcome is Status.FAILED]

    def to_json(self) -> dict[str, object]:
        return {
            "torch": {"version": self.torch_version, "git_version": self.torch_git, "source": self.source},
            "lock": self.lock,
            "outcome": self.outcome,
            "exit_code": self.exit_code,
            "fail_on": self.fail_on,
            "claims_not_run": self.claims_not_run,
            "broken_input": self.broken,
            "approved": self.approved,
            "refused": self.refused,
            "other_failures": self.other_failures,
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
                            "at": c.at,
                            "expect": c.expect.to_json() if c.expect is not None else None,
                            "ran": c.ran,
                            "blocked": c.blocked,
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
        "also": row.also,
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
        ok = sum(1 for a in g.anchors if a.outcome in (Status.PASSED, Status.APPROVED))
        cells = [Text(str(ok)), _num(g.count(g.anchors, Status.FAILED), "red")]
        if claims:
            cells += [
                _num(g.claims_held, "green"),
                _num(g.count(g.claims, Status.FAILED), "red"),
                _num(g.count(g.claims, Status.SKIPPED), "yellow"),
            ]
        rows.append((g.id, cells))
    heads = ("anchors", "drifted", "claims", "failed", "skipped")[: 5 if claims else 2]
    table = SummaryTable(heads, rows)
    legend = "anchors: unchanged or approved · drifted: to re-read"
    legend += " · claims: held (passed, or failed as their xfail expects)" if claims else ""
    parts: list[RenderableType] = [heading, Wrapped(legend, "dim"), table]
    if claims and report.claims_not_run:
        parts.append(Wrapped(f"claims did not run: {report.claims_not_run}", "yellow"))
    if claims and (xfails := expected_failures(report)):
        parts.append(Text("expected failures (known torch bugs; counted as claims ok):", style="bold"))
        parts += [Text(f"  {line}", style="cyan") for line in xfails]
    cosmetic, moved = passing_notes(report)
    if cosmetic or moved:
        parts.append(Text("notes (passing; approve to record them):", style="bold"))
        parts += [Wrapped(f"{g.id}/{a.name}: {a.drift.note()}", "cyan", "  ") for g, a in cosmetic if a.drift]
        parts += [Wrapped(line, "cyan", "  ") for line in moved_lines(moved)]
    if report.approved:
        parts.append(Text(f"approved into {report.lock}:", style="bold green"))
        parts += [Text(f"  {a}", style="green") for a in report.approved]
    if report.refused:
        parts.append(Text("not approved (nothing of these guides was recorded):", style="bold red"))
        parts += [Text(f"  {r}", style="red") for r in report.refused]
    if report.broken:
        parts.append(Text(f"broken input (exit code 2): {len(report.broken)}", style="bold red"))
        parts += [Text(f"  {problem.splitlines()[0]}", style="red") for problem in report.broken]
    if report.outcome is not None:
        parts.append(Wrapped(f"outcome: {report.outcome} (exit {report.exit_code})", "bold"))
    return Group(*parts)


@dataclass(frozen=True)
class Wrapped:
    """A line of words broken at spaces to the width it is printed at, whatever the console's soft wrap (the
    plugin's console never wraps, so that diffs and commands stay whole): a path or an id is one word, never
    split. Continuation lines are indented two more."""

    text: str
    style: str = ""
    indent: str = ""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        line = self.indent
        for word in self.text.split():
            if line.strip() and len(line) + 1 + len(word) > options.max_width:
                yield Text(line, style=self.style)
                line = self.indent + "  "
            line += ("" if not line.strip() else " ") + word
        if line.strip():
            yield Text(line, style=self.style)


Noted = list[tuple[GuideReport, AnchorRow]]  # anchors that pass with a note, with their guide


def passing_notes(report: SessionReport) -> tuple[Noted, Noted]:
    """Anchors that pass with a note: cosmetic changes (listed one by one: the text changed) and moves (collapsed
    per guide by `moved_lines`: the code is the approved code, only its lines are new)."""
    passing = [(g, a) for g in report.guides for a in g.anchors if a.outcome is Status.PASSED and a.drift is not None]
    cosmetic = [(g, a) for g, a in passing if a.drift is not None and a.drift.kind is DriftKind.COSMETIC]
    moved = [(g, a) for g, a in passing if a.drift is not None and a.drift.kind is DriftKind.MOVED]
    return cosmetic, moved


def moved_lines(moved: Noted) -> list[str]:
    """One line per guide: ``19-ddp-buckets: 5 moved (no-sync, rebuild, ...)``."""
    by_guide: dict[str, list[str]] = {}
    for g, a in moved:
        by_guide.setdefault(g.id, []).append(a.name)
    return [f"{gid}: {len(names)} moved ({', '.join(names)})" for gid, names in by_guide.items()]


READ_TOGETHER = 6  # a source block and its notes, or two blocks a few lines apart, are one passage to re-read


def spans(lines: list[int], gap: int = 1) -> str:
    """1, 2, 3, 7 → "1-3, 7"; lines at most ``gap`` apart join one span."""
    joined: list[list[int]] = []
    for line in sorted(set(lines)):
        if joined and line <= joined[-1][1] + gap:
            joined[-1][1] = line
        else:
            joined.append([line, line])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in joined)


def reread_lines(rows: list[AnchorRow]) -> str:
    """The passages of a guide to re-read for these drifted anchors: their source blocks and notes."""
    return spans([n for a in rows for n in (*a.quoted_at, *a.notes_at)], gap=READ_TOGETHER)


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


def _num(value: int, style: str) -> Text:
    return Text(str(value), style=style if value else "dim")
