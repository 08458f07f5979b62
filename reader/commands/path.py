"""Where to start and what comes next: the reading path (``fsdp-readings`` with no command, or ``path``), the
line ``show``, ``check`` and ``predict`` end with, and the glossary (``fsdp-readings glossary [TERM]``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console, Group
from rich.text import Text

from reader.format.errors import CommandProblem, GuideError, did_you_mean
from reader.format.guide import Guide
from reader.format.parse import find_readings, load_all
from reader.format.path import ReadingPath, load_glossary, load_path
from reader.study.session import CLEAN, display
from reader.views.path import path_view, term_view
from reader.views.problem import guarded

PATH_EXAMPLES = """examples:
  fsdp-readings                     the path: where to start, the tracks in order, and the commands
  fsdp-readings show 1              a guide by its number (or a unique prefix of its id)
  fsdp-readings glossary unit       what a word the guides use means, and the guide that shows it
  fsdp-readings search prefetch     the guides, claims, notes and symbols that mention it"""


def readings_found(readings: Path | None) -> Path:
    """The readings directory (``--readings``, else ./readings, else the checkout's), or `CommandProblem`."""
    found = find_readings(readings)
    if found is None or not found.is_dir():
        raise CommandProblem("no readings directory", NO_READINGS_FIX)
    return found


NO_READINGS_FIX = "pass --readings DIR (a checkout's readings/)"


def guides_and_path(readings: Path | None) -> tuple[list[Guide], ReadingPath]:
    """The guides and the path over them; `CommandProblem` when they cannot be read."""
    found = readings_found(readings)
    guides, _ = load_all([found], None)
    try:
        return guides, load_path(found, [g.id for g in guides])
    except (GuideError, OSError) as exc:
        raise CommandProblem(str(exc), "fix the path file's problems above, then run the command again") from None


def configure_path(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = PATH_EXAMPLES


@guarded
def run_path(args: argparse.Namespace, console: Console) -> int:
    guides, path = guides_and_path(args.readings)
    console.print(path_view(guides, path, console.width), soft_wrap=False)
    return CLEAN


GLOSSARY_EXAMPLES = """examples:
  fsdp-readings glossary                 every term
  fsdp-readings glossary "flat parameter"
  fsdp-readings glossary seeds           (a part of a term finds it)"""


def configure_glossary(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = GLOSSARY_EXAMPLES
    parser.add_argument("term", nargs="*", metavar="TERM", help="a term, or part of one (default: every term)")


@guarded
def run_glossary(args: argparse.Namespace, console: Console) -> int:
    found = readings_found(args.readings)
    guides, _ = load_all([found], None)
    try:
        terms = load_glossary(found, [g.id for g in guides])
    except (GuideError, OSError) as exc:
        raise CommandProblem(str(exc), "fix the glossary's problems above, then run the command again") from None
    wanted = " ".join(args.term).casefold()
    shown = [t for t in terms if wanted in t.term.casefold()] if wanted else list(terms)
    if not shown:
        close = did_you_mean(wanted, [t.term for t in terms])
        raise CommandProblem(f"no term `{wanted}`" + (f" ({close})" if close else ""),
                             f"name one of the terms: {', '.join(t.term for t in terms)}")  # fmt: skip
    console.print(Group(*(term_view(t, console.width) for t in shown)), soft_wrap=False)
    console.print(Text(f"from {display(found / 'glossary.toml')}", style="dim"), soft_wrap=False)
    return CLEAN
