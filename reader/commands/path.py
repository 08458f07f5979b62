"""Where to start and what comes next: the reading path (``fsdp-readings`` with no command, or ``path``), the
line ``show``, ``check`` and ``predict`` end with, and the glossary (``fsdp-readings glossary [TERM]``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console, Group
from rich.text import Text

from reader.format.errors import GuideError, did_you_mean
from reader.format.guide import Guide
from reader.format.parse import find_readings, load_all
from reader.format.path import ReadingPath, load_glossary, load_path
from reader.study.session import BROKEN, CLEAN, display
from reader.views.path import path_view, term_view

PATH_EXAMPLES = """examples:
  fsdp-readings                     the path: where to start, the tracks in order, and the commands
  fsdp-readings show 1              a guide by its number (or a unique prefix of its id)
  fsdp-readings glossary unit       what a word the guides use means, and the guide that shows it
  fsdp-readings search prefetch     the guides, claims, notes and symbols that mention it"""


def guides_and_path(readings: Path | None, console: Console) -> tuple[list[Guide], ReadingPath] | int:
    """The guides and the path over them, or an exit code with the problem printed."""
    found = find_readings(readings)
    if found is None or not found.is_dir():
        console.print("[red]no readings directory[/]: pass --readings DIR (a checkout's readings/)")
        return BROKEN
    guides, _ = load_all([found], None)
    try:
        return guides, load_path(found, [g.id for g in guides])
    except (GuideError, OSError) as exc:
        console.print(str(exc), markup=False, highlight=False)
        return BROKEN


def configure_path(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = PATH_EXAMPLES


def run_path(args: argparse.Namespace, console: Console) -> int:
    opened = guides_and_path(args.readings, console)
    if isinstance(opened, int):
        return opened
    guides, path = opened
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


def run_glossary(args: argparse.Namespace, console: Console) -> int:
    found = find_readings(args.readings)
    if found is None:
        console.print("[red]no readings directory[/]: pass --readings DIR (a checkout's readings/)")
        return BROKEN
    guides, _ = load_all([found], None)
    try:
        terms = load_glossary(found, [g.id for g in guides])
    except (GuideError, OSError) as exc:
        console.print(str(exc), markup=False, highlight=False)
        return BROKEN
    wanted = " ".join(args.term).casefold()
    shown = [t for t in terms if wanted in t.term.casefold()] if wanted else list(terms)
    if not shown:
        close = did_you_mean(wanted, [t.term for t in terms])
        hint = f"{close} " if close else ""
        console.print(f"[red]no term `{wanted}`[/] {hint}(terms: {', '.join(t.term for t in terms)})")
        return BROKEN
    console.print(Group(*(term_view(t, console.width) for t in shown)), soft_wrap=False)
    console.print(Text(f"from {display(found / 'glossary.toml')}", style="dim"), soft_wrap=False)
    return CLEAN
