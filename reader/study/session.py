"""What every ``fsdp-readings`` command shares: exit codes, the guides and torch source it opens, options."""

from __future__ import annotations

import argparse
import difflib
from dataclasses import dataclass

from rich.console import Console

from reader.format.errors import CommandProblem, GuideError
from reader.format.guide import Guide
from reader.format.parse import find_readings, load_all
from reader.gate.lock import LockError
from reader.gate.outcome import Outcome
from reader.gate.report import SessionReport
from reader.gate.workspace import LOCK_NAME, Workspace
from reader.source.checkref import CheckFinder
from reader.source.files import relative_to_cwd
from reader.source.torch_source import SourceError, open_source

CLEAN, FAILED, BROKEN, REREAD = (o.code for o in (Outcome.CLEAN, Outcome.BEHAVIOUR, Outcome.BROKEN, Outcome.REREAD))
DRIFT = FAILED  # exit 1 under its old name, which the study commands still import: a claim failed, not drift


@dataclass
class Session:
    workspace: Workspace
    guides: list[Guide]
    broken: list[GuideError]
    report: SessionReport
    # Every guide's id, asked for or not, for the path; None when a guide did not load (the path then parses them
    # itself, without checking check references, so a guide with a broken check is still on it).
    guide_ids: list[str] | None


def guide_named(given: str, ids: list[str]) -> str | list[str]:
    """The guide id ``given`` names: the id itself, its number (``6``, ``06``) or a prefix of exactly one id
    (``06-back``); else the close ids to suggest (possibly none)."""
    if given in ids:
        return given
    number = given.zfill(2) if given.isdigit() else None
    matches = [i for i in ids if i.startswith(f"{number}-")] if number else [i for i in ids if i.startswith(given)]
    if len(matches) == 1:
        return matches[0]
    return matches or difflib.get_close_matches(given, ids, n=3, cutoff=0.5)


def open_session(args: argparse.Namespace, console: Console) -> Session:
    """The guides ``args`` names (all, by default) and the torch source to read them against; `CommandProblem`
    when the readings, a named guide, the torch source or the lock cannot be read. The problems of guides that do
    not parse are printed (the others still open)."""
    readings = find_readings(args.readings)
    if readings is None or not readings.is_dir():
        where = f"at {readings}" if readings is not None else "here (./readings) or beside this install"
        raise CommandProblem(
            f"no readings directory {where}",
            "pass --readings DIR, the readings/ folder of a checkout of fsdp-readings (a wheel install ships no "
            "guides)",
        )
    args.readings = readings
    guides, broken = load_all([readings], CheckFinder(extra_paths=[readings.resolve().parent]))
    ids = [g.id for g in guides]
    path_ids = None if broken else ids
    if args.guide_ids:
        wanted = _named_guides(args.guide_ids, ids, broken)
        args.guide_ids = [g for g in ids if g in wanted]
        guides = [g for g in guides if g.id in wanted]
        broken = []  # problems of guides not asked for are not this command's business
    try:
        source = open_source(args.torch_source)
    except SourceError as exc:
        raise CommandProblem(str(exc), "name a torch wheel, site-packages dir or checkout, or install torch") from None
    workspace = Workspace(source, readings / LOCK_NAME)
    try:
        workspace.lock  # noqa: B018 - validate the lock up front: a malformed lock is broken input
    except LockError as exc:
        source.close()
        raise CommandProblem(str(exc), "restore it from version control, or re-approve") from None
    report = SessionReport(
        source.version, source.git_version, f"{source.kind} at {source.location}", str(workspace.lock_path)
    )
    report.broken = [error.render() for error in broken]
    for error in broken:
        # The problems quote the guide (TOML, `[[claims]]`): printed as text, never read as markup.
        console.print(error.render(), style="red", highlight=False, markup=False)
    return Session(workspace, guides, broken, report, path_ids)


def _named_guides(given: list[str], ids: list[str], broken: list[GuideError]) -> set[str]:
    """The guide ids ``given`` names, or `CommandProblem`: a named guide that does not parse (with its
    problems), or a name that is no guide's (with the close ones, and the guides to choose from)."""
    resolved = [(name, guide_named(name, ids)) for name in given]
    unknown = [(name, found) for name, found in resolved if not isinstance(found, str)]
    asked_broken = _broken_named([name for name, _ in unknown], broken)
    if asked_broken:  # the guide exists but does not parse: its problems, not "unknown guide id"
        problems = "\n".join(error.render(relative_to_cwd(error.problems[0].path)) for error in asked_broken)
        raise CommandProblem(problems, "fix the guide's problems above, then run the command again")
    if unknown:
        said = [f"unknown guide id: {name}" + (f" (did you mean {', '.join(close)}?)" if close else "")
                for name, close in unknown]  # fmt: skip
        raise CommandProblem("\n".join(said), f"name one of the guides: {', '.join(sorted(ids)) or 'none'}")
    return {found for _, found in resolved if isinstance(found, str)}


def _broken_named(given: list[str], broken: list[GuideError]) -> list[GuideError]:
    """The guides that failed to parse that ``given`` names, by their file's name (``05-broken``, ``05``, a
    prefix): their id could not be read, and the file is named after it."""
    stems = {error.problems[0].path.stem: error for error in broken}
    named = [guide_named(name, list(stems)) for name in given]
    return [stems[found] for found in named if isinstance(found, str)]


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("guide_ids", nargs="*", metavar="GUIDE_ID", help="guides to act on (default: all)")
    parser.add_argument(
        "--torch-source",
        metavar="PATH",
        default=None,
        help="a torch wheel (read in place), site-packages dir or checkout instead of the installed torch",
    )


display = relative_to_cwd  # how the commands name files
