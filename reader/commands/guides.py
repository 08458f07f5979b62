"""The commands over guides and their anchors: ``list`` (where each guide stands), ``show`` (a guide with its torch
source quoted live), ``drift`` (anchors against the approved source) and ``approve`` (record the source read)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from reader.claims.progress import Progress, ProgressError
from reader.commands.session import BROKEN, CLEAN, DRIFT, add_common, display, open_session
from reader.format.guide import Guide
from reader.gate.drift import DriftKind
from reader.gate.drift_report import write_drift_report
from reader.gate.lock import check_release
from reader.gate.report import AnchorRow, anchor_row, drift_panel, summary
from reader.gate.workspace import NotApprovable, Workspace
from reader.views.guide import print_guide


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


def configure_list(parser: argparse.ArgumentParser) -> None:
    add_common(parser)


def run_list(args: argparse.Namespace, console: Console) -> int:
    """The guides in reading order, each with where it stands: its anchors' drift on this torch, how many of its
    claims passed when ``check`` last ran them, the predict score and the exercises solved."""
    session = open_session(args, console)
    if isinstance(session, int):
        return session
    try:
        progress: Progress | None = Progress()
    except ProgressError as exc:
        console.print(f"[yellow]{exc}[/]")
        progress = None
    table = Table(title=f"Reading guides · torch {session.workspace.torch_version}", title_justify="left", expand=True)
    table.add_column("guide", ratio=1, overflow="fold")
    for column in ("anchors", "claims", "predict", "exercises"):
        table.add_column(column, justify="right", no_wrap=True)
    for guide in sorted(session.guides, key=lambda g: (g.order, g.id)):
        table.add_row(
            Text.assemble((guide.id, "bold"), "\n", (guide.title, "dim")),
            _anchor_status(session.workspace, guide),
            _claim_status(guide, progress),
            _score(progress.score(guide.id) if progress else (0, 0)),
            _score(progress.score(guide.id, "exercises") if progress else (0, 0)),
        )
    console.print(table, soft_wrap=False)
    return BROKEN if session.broken else CLEAN


def _anchor_status(workspace: Workspace, guide: Guide) -> Text:
    if not guide.anchors:
        return Text("-", style="dim")
    drifted = sum(1 for anchor in guide.anchors if not workspace.drift(guide, anchor).ok)
    if drifted:
        return Text(f"{drifted}/{len(guide.anchors)} drifted", style="red")
    return Text(f"{len(guide.anchors)} ok", style="green")


def _claim_status(guide: Guide, progress: Progress | None) -> Text:
    last = progress.claims(guide.id) if progress else {}
    ran = [last[c.id] for c in guide.claims if c.id in last]
    if not guide.claims:
        return Text("-", style="dim")
    if not ran:
        return Text(f"0/{len(guide.claims)}", style="dim")
    failed = ran.count("failed")
    held = len(ran) - failed - ran.count("skipped")  # passed, or failing as their xfail expects
    shown = f"{held}/{len(guide.claims)}" + (f" ({failed} failed)" if failed else "")
    return Text(shown, style="red" if failed else "green")


def _score(right_of: tuple[int, int]) -> Text:
    right, tried = right_of
    return (
        Text(f"{right}/{tried}", style="green" if tried and right == tried else "") if tried else Text("-", style="dim")
    )


def configure_show(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("--answers", action="store_true", help="show the predict questions' answers too")


def run_show(args: argparse.Namespace, console: Console) -> int:
    if not args.guide_ids:
        console.print("[red]name the guide to show[/] (fsdp-readings list shows them)")
        return BROKEN
    session = open_session(args, console)
    if isinstance(session, int):
        return session
    for guide in sorted(session.guides, key=lambda g: (g.order, g.id)):
        print_guide(console, guide, session.workspace, answers=args.answers)
    return BROKEN if session.broken else CLEAN
