"""What every ``fsdp-readings`` command shares: exit codes, the guides and torch source it opens, options."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from rich.console import Console

from reader.format.errors import GuideError
from reader.format.guide import Guide
from reader.format.parse import find_readings, load_all
from reader.gate.lock import LockError
from reader.gate.report import SessionReport
from reader.gate.workspace import LOCK_NAME, Workspace
from reader.source.checkref import CheckFinder
from reader.source.files import relative_to_cwd
from reader.source.torch_source import SourceError, open_source

CLEAN, DRIFT, BROKEN = 0, 1, 2


@dataclass
class Session:
    workspace: Workspace
    guides: list[Guide]
    broken: list[GuideError]
    report: SessionReport


def open_session(args: argparse.Namespace, console: Console) -> Session | int:
    readings = find_readings(args.readings)
    if readings is None or not readings.is_dir():
        where = f"at {readings}" if readings is not None else "here (./readings) or beside this install"
        console.print(
            f"[red]no readings directory {where}[/]: pass --readings DIR, the readings/ folder of a checkout of "
            "fsdp-readings (a wheel install ships no guides)"
        )
        return BROKEN
    args.readings = readings
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


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("guide_ids", nargs="*", metavar="GUIDE_ID", help="guides to act on (default: all)")
    parser.add_argument(
        "--torch-source",
        metavar="PATH",
        default=None,
        help="a torch wheel (read in place), site-packages dir or checkout instead of the installed torch",
    )


display = relative_to_cwd  # how the commands name files
