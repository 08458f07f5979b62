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
from rich.text import Text

from reader import estimate_view, layout_view, memory_view, upgrade_gate
from reader.cli_session import BROKEN, CLEAN, DRIFT, add_common, display, open_session
from reader.drift import DriftKind
from reader.drift_report import write_drift_report
from reader.guide import Guide
from reader.lock import check_release
from reader.progress import Progress, ProgressError
from reader.render import print_guide
from reader.report import AnchorRow, anchor_row, drift_panel, summary
from reader.study import (
    configure_check,
    configure_exercise,
    configure_predict,
    run_check,
    run_exercise,
    run_predict,
)
from reader.timeline import configure as configure_timeline
from reader.timeline import run as run_timeline
from reader.workspace import NotApprovable, Workspace


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Console], int]


# --- drift --------------------------------------------------------------------------------------------------


def _configure_drift(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument(
        "--report",
        metavar="FILE",
        type=Path,
        default=None,
        help="also write the report as JSON to FILE and as Markdown next to it",
    )


def _run_drift(args: argparse.Namespace, console: Console) -> int:
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


# --- approve ------------------------------------------------------------------------------------------------


def _configure_approve(parser: argparse.ArgumentParser) -> None:
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


def _run_approve(args: argparse.Namespace, console: Console) -> int:
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


# --- list and show ------------------------------------------------------------------------------------------


def _configure_list(parser: argparse.ArgumentParser) -> None:
    add_common(parser)


def _run_list(args: argparse.Namespace, console: Console) -> int:
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


def _configure_show(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("--answers", action="store_true", help="show the predict questions' answers too")


def _run_show(args: argparse.Namespace, console: Console) -> int:
    if not args.guide_ids:
        console.print("[red]name the guide to show[/] (fsdp-readings list shows them)")
        return BROKEN
    session = open_session(args, console)
    if isinstance(session, int):
        return session
    for guide in sorted(session.guides, key=lambda g: (g.order, g.id)):
        print_guide(console, guide, session.workspace, answers=args.answers)
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
    Command("check", "run a guide's claims on the rank pool", configure_check, run_check),
    Command(
        "predict", "answer a guide's predict questions, each revealed by a real run", configure_predict, run_predict
    ),
    Command(
        "exercise", "name the claim a break-it patch makes fail, then watch it fail", configure_exercise, run_exercise
    ),
    Command("memory", "bytes held per category over a step, from a real run", memory_view.configure, memory_view.run),
    Command(
        "layout", "a real flat parameter across ranks, as a claim's run read it", layout_view.configure, layout_view.run
    ),
    Command(
        "estimate",
        "memory, communication and cost per strategy, and the budget guard",
        estimate_view.configure,
        estimate_view.run,
    ),
    Command(
        "upgrade-gate",
        "install other torch releases in venvs of their own and run the guides there, for real; reports per release",
        upgrade_gate.configure,
        upgrade_gate.run,
    ),
    Command(
        "timeline",
        "a claim's FSDP events and collectives in issue order, each with the torch line that issued it",
        configure_timeline,
        run_timeline,
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
