"""The commands over guides and their anchors: ``list`` (where each guide stands), ``show`` (a guide with its torch
source quoted live), ``drift`` (anchors against the approved source) and ``approve`` (record the source read)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from reader.claims.progress import Progress, ProgressError, Section
from reader.format.guide import Guide
from reader.format.predict import PredictQuestion
from reader.gate.drift import DriftKind
from reader.gate.drift_report import write_drift_report
from reader.gate.lock import check_release
from reader.gate.report import AnchorRow, anchor_row, drift_panel, summary
from reader.gate.workspace import NotApprovable, Workspace
from reader.source.checkref import CheckFinder
from reader.study.session import BROKEN, CLEAN, DRIFT, add_common, display, open_session
from reader.views.fit import indented, items_line
from reader.views.guide import print_guide
from reader.views.path import print_next


def configure_drift(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument(
        "--report",
        metavar="FILE",
        type=Path,
        default=None,
        help="also write the report as JSON to FILE and as Markdown next to it",
    )


def run_drift(args: argparse.Namespace, console: Console) -> int:
    opened = open_session(args, console)
    if isinstance(opened, int):
        return opened
    workspace, report = opened.workspace, opened.report
    for guide in opened.guides:
        row = report.guide(guide.id, display(guide.path), guide.title)
        applies = guide.applies_to(workspace.torch_version)
        for anchor in guide.anchors:
            if not applies:
                row.anchors.append(
                    AnchorRow(anchor.name, anchor.symbol, "skipped", message=f"applies to torch {guide.torch}")
                )
                continue
            drift = workspace.drift(guide, anchor)
            row.anchors.append(anchor_row(guide, anchor, "passed" if drift.ok else "failed", drift))
    for guide_row in report.guides:
        for found in guide_row.anchors:
            if found.outcome == "failed":
                console.print(drift_panel(guide_row, found))
    code = BROKEN if opened.broken else DRIFT if report.drifted else CLEAN
    report.exit_code = code
    console.print(summary(report, claims=False))
    if args.report is not None:
        json_path, md_path = write_drift_report(args.report, report)
        console.print(f"drift report: {display(json_path)}, {display(md_path)}")
    workspace.source.close()
    return code


def configure_approve(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument(
        "--matrix",
        metavar="RELEASES",
        type=_releases,
        help="keep the approved sources of these torch releases, comma-separated (e.g. 2.13,2.15), so that every "
        "leg of a CI matrix passes; stored in the lock. An empty string drops the matrix",
    )


def _releases(text: str) -> tuple[str, ...]:
    releases = tuple(r.strip() for r in text.split(",") if r.strip())
    for release in releases:
        try:
            check_release(release)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc
    return releases


def run_approve(args: argparse.Namespace, console: Console) -> int:
    opened = open_session(args, console)
    if isinstance(opened, int):
        return opened
    workspace, report = opened.workspace, opened.report
    refused = 0
    if args.matrix is not None:
        for dropped in workspace.set_matrix(args.matrix):
            console.print(f"dropped approved source outside the matrix: {dropped}")
        matrix = ", ".join(workspace.lock.matrix) or "none (the newest approval wins)"
        console.print(f"torch matrix: {matrix}")
    for guide in opened.guides:
        row = report.guide(guide.id, display(guide.path), guide.title)
        for anchor in guide.anchors:
            try:
                approval = workspace.approve(guide, anchor)
            except NotApprovable as exc:
                refused += 1
                row.anchors.append(anchor_row(guide, anchor, "failed", exc.drift))
                console.print(drift_panel(row, row.anchors[-1]))
                continue
            was = approval.drift.kind
            row.anchors.append(anchor_row(guide, anchor, "approved", approval.drift))
            report.approved.append(
                f"{guide.id}/{anchor.name} (was: {was.value}; torch {', '.join(approval.entry.approved_on)})"
            )
            if approval.drift.diff and was not in (DriftKind.UNCHANGED, DriftKind.MOVED):
                console.print(f"[bold]{guide.id}/{anchor.name}[/]: approving {was.value}")
                console.print(approval.drift.diff, markup=False, highlight=False)
        if all(a.outcome == "approved" for a in row.anchors):
            for key in workspace.prune(guide):
                console.print(f"dropped stale lock entry {key}")
    if not args.guide_ids and not opened.broken:
        # Approving every guide: entries of guides that no longer exist are stale too.
        for key in workspace.prune_missing_guides({g.id for g in opened.guides}):
            console.print(f"dropped stale lock entry {key}")
    wrote = workspace.save()
    console.print(summary(report, claims=False))
    console.print(f"{'wrote' if wrote else 'unchanged:'} {display(workspace.lock_path)}")
    workspace.source.close()
    return BROKEN if opened.broken else DRIFT if refused else CLEAN


LIST_EXAMPLES = """examples:
  fsdp-readings list                          every guide, in reading order, and where you stand on each
  fsdp-readings list 06-backward-prefetch     one guide
  fsdp-readings --readings ~/src/fsdp-readings/readings list

columns: anchors (drift of the torch code each guide quotes, on this torch), claims (results of the last run of
each claim on this torch: pytest readings/, check, predict and the views record them; "not run" until then),
predict (questions answered right the first time, of those answered) and exercises (the same)"""

WIDE = 100  # from this width the list is a table; below it, two lines per guide


def configure_list(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = LIST_EXAMPLES
    add_common(parser)


def run_list(args: argparse.Namespace, console: Console) -> int:
    """The guides in reading order, each with where it stands: its anchors' drift on this torch, how many of its
    claims held when they last ran on this torch, the predict score and the exercises solved."""
    session = open_session(args, console)
    if isinstance(session, int):
        return session
    try:
        progress: Progress | None = Progress()
    except ProgressError as exc:
        console.print(f"[yellow]{exc}[/]")
        progress = None
    torch = session.workspace.torch_version
    checks = CheckFinder(extra_paths=[args.readings.resolve().parent])
    rows = []
    for guide in sorted(session.guides, key=lambda g: (g.order, g.id)):
        modules = {claim.check.split(":")[0] for claim in guide.claims}
        statuses = (
            ("anchors", _anchor_status(session.workspace, guide)),
            ("claims", _claim_status(guide, progress, torch)),
            ("predict", _score(len(guide.regions_of(PredictQuestion)), progress, guide.id, "predict")),
            ("exercises", _score(sum(map(checks.exercise_count, modules)), progress, guide.id, "exercises")),
        )
        rows.append((guide, statuses))
    title = f"Reading guides · torch {torch}"
    console.print(
        _list_table(title, rows) if console.width >= WIDE else _list_lines(title, rows, console.width), soft_wrap=False
    )
    return BROKEN if session.broken else CLEAN


def _list_table(title: str, rows: list[tuple[Guide, tuple[tuple[str, Text], ...]]]) -> Table:
    table = Table(title=title, title_justify="left", expand=True)
    longest = max((len(guide.id) for guide, _ in rows), default=10)
    table.add_column("guide", ratio=1, min_width=longest)
    for column, _ in rows[0][1] if rows else ():
        table.add_column(column, justify="right", no_wrap=True)
    for guide, statuses in rows:
        name = Text.assemble((guide.id, "bold"), "\n", (guide.title, "dim"))
        table.add_row(name, *(status for _, status in statuses))
    return table


def _list_lines(title: str, rows: list[tuple[Guide, tuple[tuple[str, Text], ...]]], width: int) -> Group:
    """A few lines a guide: its id, then (indented, wrapping at words) its title and its labelled statuses."""
    lines: list[Text] = [Text(title, style="bold")]
    for guide, statuses in rows:
        labelled = [Text.assemble((f"{label} ", "dim"), value) for label, value in statuses]
        lines += [Text(guide.id, style="bold"), indented(guide.title, width, "dim"), items_line(labelled, width)]
    return Group(*lines)


def _anchor_status(workspace: Workspace, guide: Guide) -> Text:
    if not guide.anchors:
        return Text("none", style="dim")
    drifted = sum(1 for anchor in guide.anchors if not workspace.drift(guide, anchor).ok)
    if drifted:
        return Text(f"{drifted}/{len(guide.anchors)} drifted", style="red")
    return Text(f"{len(guide.anchors)} ok", style="green")


def _claim_status(guide: Guide, progress: Progress | None, torch: str | None) -> Text:
    """Claims that held (passed, or failed as their xfail expects) of the guide's claims, in their last run on this
    torch; "not run" when none has run on it."""
    if not guide.claims:
        return Text("none", style="dim")
    last = progress.claims(guide.id, torch) if progress else {}
    ran = [last[c.id] for c in guide.claims if c.id in last]
    if not ran:
        return Text("not run", style="dim")
    failed = ran.count("failed")
    held = sum(1 for result in ran if result in ("passed", "xfailed"))
    shown = f"{held}/{len(guide.claims)}" + (f" ({failed} failed)" if failed else "")
    return Text(shown, style="red" if failed else "green")


def _score(items: int, progress: Progress | None, guide_id: str, section: Section) -> Text:
    """Right the first time, of those tried; "none" when the guide has none, "not tried" before the first."""
    if not items:
        return Text("none", style="dim")
    right, tried = progress.score(guide_id, section) if progress else (0, 0)
    if not tried:
        return Text("not tried", style="dim")
    return Text(f"{right}/{tried}", style="green" if right == tried else "")


SHOW_EXAMPLES = """examples:
  fsdp-readings show 06-backward-prefetch                  the guide, its torch source quoted live
  fsdp-readings show 06-backward-prefetch --answers        with its predict questions' answers
  FORCE_COLOR=1 fsdp-readings show 06-backward-prefetch | less -R      page through it, in colour

--answers reveals the answers: predict questions answered after that are practice, and do not score"""


def configure_show(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = SHOW_EXAMPLES
    parser.add_argument("guide_ids", nargs="+", metavar="GUIDE_ID", help="the guides to show (at least one)")
    parser.add_argument(
        "--torch-source",
        metavar="PATH",
        default=None,
        help="quote a torch wheel (read in place), site-packages dir or checkout instead of the installed torch",
    )
    parser.add_argument("--answers", action="store_true", help="show the predict questions' answers too")


def run_show(args: argparse.Namespace, console: Console) -> int:
    session = open_session(args, console)
    if isinstance(session, int):
        return session
    guides = sorted(session.guides, key=lambda g: (g.order, g.id))
    if args.answers:
        _reveal_answers(guides, console)
    for guide in guides:
        print_guide(console, guide, session.workspace, answers=args.answers)
    if len(guides) == 1:
        print_next(console, args.readings, guides[0].id)
    return BROKEN if session.broken else CLEAN


def _reveal_answers(guides: list[Guide], console: Console) -> None:
    """Answers seen are answers known: later predict attempts of these questions are practice."""
    try:
        progress = Progress()
    except ProgressError as exc:
        console.print(f"[yellow]{exc}[/]")
        return
    for guide in guides:
        progress.reveal(guide.id, [q.id for q in guide.regions_of(PredictQuestion)])
    progress.save()
