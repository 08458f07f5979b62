"""``fsdp-readings``: the reading guides from the terminal.

Each subcommand is a ``Command`` (name, help, how to configure its parser, how to run it) in ``COMMANDS``;
adding one (list, show, check, predict, timeline) means writing its two functions and appending it there. Exit
codes match the pytest plugin: 0 clean, 1 drift (or something that could not be approved), 2 broken input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from reader.checkref import CheckFinder
from reader.drift import DriftKind
from reader.errors import GuideError
from reader.guide import Guide
from reader.lock import LockError
from reader.render import print_guide
from reader.report import (
    AnchorRow,
    SessionReport,
    drift_panel,
    summary,
    write_drift_report,
)
from reader.torch_source import SourceError, open_source
from reader.workspace import LOCK_NAME, NotApprovable, Workspace, load_all

CLEAN, DRIFT, BROKEN = 0, 1, 2


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Console], int]


# --- shared -------------------------------------------------------------------------------------------------


@dataclass
class Session:
    workspace: Workspace
    guides: list[Guide]
    broken: list[GuideError]
    report: SessionReport


def _open(args: argparse.Namespace, console: Console) -> Session | int:
    readings: Path = args.readings
    if not readings.is_dir():
        console.print(f"[red]no readings directory at {readings}[/] (pass --readings DIR)")
        return BROKEN
    guides, broken = load_all([readings], CheckFinder(extra_paths=[readings.resolve().parent]))
    wanted: list[str] = args.guide_ids
    if wanted:
        unknown = sorted(set(wanted) - {g.id for g in guides})
        if unknown:
            known = ", ".join(sorted(g.id for g in guides)) or "none"
            console.print(f"[red]unknown guide id(s): {', '.join(unknown)}[/] (guides: {known})")
            return BROKEN
        guides = [g for g in guides if g.id in wanted]
        broken = []  # problems of guides not asked for are not this command's business
    try:
        source = open_source(args.torch_source)
    except SourceError as exc:
        console.print(f"[red]{exc}[/]")
        return BROKEN
    workspace = Workspace(source, readings / LOCK_NAME)
    try:
        workspace.lock  # noqa: B018 - validate the lock up front: a malformed lock is broken input
    except LockError as exc:
        console.print(f"[red]{exc}[/]\n    fix: restore it from version control, or re-approve")
        return BROKEN
    report = SessionReport(
        source.version, source.git_version, f"{source.kind} at {source.location}", str(workspace.lock_path)
    )
    report.broken = [error.render() for error in broken]
    for error in broken:
        console.print(f"[red]{error.render()}[/]", highlight=False, markup=False)
    return Session(workspace, guides, broken, report)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("guide_ids", nargs="*", metavar="GUIDE_ID", help="guides to act on (default: all)")
    parser.add_argument(
        "--torch-source",
        metavar="PATH",
        default=None,
        help="a torch wheel (read in place), site-packages dir or checkout instead of the installed torch",
    )


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# --- drift --------------------------------------------------------------------------------------------------


def _configure_drift(parser: argparse.ArgumentParser) -> None:
    _add_common(parser)
    parser.add_argument(
        "--report",
        metavar="FILE",
        type=Path,
        default=None,
        help="also write the report as JSON to FILE and as Markdown next to it",
    )


def _run_drift(args: argparse.Namespace, console: Console) -> int:
    opened = _open(args, console)
    if isinstance(opened, int):
        return opened
    workspace, report = opened.workspace, opened.report
    for guide in opened.guides:
        row = report.guide(guide.id, _display(guide.path), guide.title)
        applies = guide.applies_to(workspace.torch_version)
        for anchor in guide.anchors:
            if not applies:
                row.anchors.append(
                    AnchorRow(anchor.name, anchor.symbol, "skipped", message=f"applies to torch {guide.torch}")
                )
                continue
            drift = workspace.drift(guide, anchor)
            row.anchors.append(AnchorRow(anchor.name, anchor.symbol, "passed" if drift.ok else "failed", drift))
    for guide_row in report.guides:
        for anchor_row in guide_row.anchors:
            if anchor_row.outcome == "failed":
                console.print(drift_panel(guide_row, anchor_row))
    code = BROKEN if opened.broken else DRIFT if report.drifted else CLEAN
    report.exit_code = code
    console.print(summary(report, claims=False))
    if args.report is not None:
        json_path, md_path = write_drift_report(args.report, report)
        console.print(f"drift report: {_display(json_path)}, {_display(md_path)}")
    workspace.source.close()
    return code


# --- approve ------------------------------------------------------------------------------------------------


def _configure_approve(parser: argparse.ArgumentParser) -> None:
    _add_common(parser)


def _run_approve(args: argparse.Namespace, console: Console) -> int:
    opened = _open(args, console)
    if isinstance(opened, int):
        return opened
    workspace, report = opened.workspace, opened.report
    refused = 0
    for guide in opened.guides:
        row = report.guide(guide.id, _display(guide.path), guide.title)
        for anchor in guide.anchors:
            try:
                approval = workspace.approve(guide, anchor)
            except NotApprovable as exc:
                refused += 1
                row.anchors.append(AnchorRow(anchor.name, anchor.symbol, "failed", exc.drift))
                console.print(drift_panel(row, row.anchors[-1]))
                continue
            was = approval.drift.kind
            row.anchors.append(AnchorRow(anchor.name, anchor.symbol, "approved", approval.drift))
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
    console.print(f"{'wrote' if wrote else 'unchanged:'} {_display(workspace.lock_path)}")
    workspace.source.close()
    return BROKEN if opened.broken else DRIFT if refused else CLEAN


# --- list and show ------------------------------------------------------------------------------------------


def _configure_list(parser: argparse.ArgumentParser) -> None:
    _add_common(parser)


def _run_list(args: argparse.Namespace, console: Console) -> int:
    session = _open(args, console)
    if isinstance(session, int):
        return session
    table = Table(title=f"Reading guides · torch {session.workspace.torch_version}", title_justify="left")
    for column in ("order", "guide", "title", "anchors", "claims"):
        table.add_column(column, justify="right" if column in ("order", "anchors", "claims") else "left")
    for guide in sorted(session.guides, key=lambda g: (g.order, g.id)):
        table.add_row(str(guide.order), guide.id, guide.title, str(len(guide.anchors)), str(len(guide.claims)))
    console.print(table)
    return BROKEN if session.broken else CLEAN


def _configure_show(parser: argparse.ArgumentParser) -> None:
    _add_common(parser)


def _run_show(args: argparse.Namespace, console: Console) -> int:
    if not args.guide_ids:
        console.print("[red]name the guide to show[/] (fsdp-readings list shows them)")
        return BROKEN
    session = _open(args, console)
    if isinstance(session, int):
        return session
    for guide in sorted(session.guides, key=lambda g: (g.order, g.id)):
        print_guide(console, guide, session.workspace)
    return BROKEN if session.broken else CLEAN


COMMANDS: list[Command] = [
    Command("list", "the guides, in reading order", _configure_list, _run_list),
    Command(
        "show",
        "a guide with its torch source quoted live and its notes pinned to the lines",
        _configure_show,
        _run_show,
    ),
    Command(
        "drift",
        "compare the guides' anchors with the approved source (exit 0 clean, 1 drift, 2 broken)",
        _configure_drift,
        _run_drift,
    ),
    Command(
        "approve",
        "record the anchors' current torch source as approved, after you re-read the guides",
        _configure_approve,
        _run_approve,
    ),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fsdp-readings", description="Reading guides over PyTorch FSDP's source.")
    parser.add_argument(
        "--readings",
        type=Path,
        default=Path("readings"),
        metavar="DIR",
        help="directory holding the guides and anchors.lock (default: ./readings)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.help, description=command.help)
        command.configure(sub)
        sub.set_defaults(run=command.run)
    return parser


def make_console(**options: Any) -> Console:
    """The console every command prints to (``options`` override, e.g. a file and a width in tests).
    soft_wrap: long paths and commands are printed whole, for copy-paste and CI logs; ``show`` prints its
    guide word-wrapped regardless (`reader.render.print_guide`). Not a terminal (piped, redirected): no
    colour and no escape codes, at the width in ``$COLUMNS`` or 80."""
    return Console(**{"highlight": False, "soft_wrap": True, **options})


def main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args, console if console is not None else make_console()))


if __name__ == "__main__":
    sys.exit(main())
