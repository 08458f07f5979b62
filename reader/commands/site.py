"""``fsdp-readings site OUT/``: the guides as a static site (`reader.site`), quoted from the installed torch (or
``--torch-source``) as ``show`` quotes it; claims' results and pictures come from their last runs."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console
from rich.text import Text

from reader.format.errors import CommandProblem
from reader.site.build import build_site
from reader.study.session import BROKEN, CLEAN, add_common, display, open_session
from reader.views.problem import guarded

EXAMPLES = """examples:
  fsdp-readings site site/                  every guide, read against the installed torch
  fsdp-readings site site/ --torch-source torch-2.15.0-cp311-cp311-manylinux_2_28_x86_64.whl

then open site/index.html in a browser (no server needed). No claim runs: each claim shows its last result on
this torch (pytest readings/ and fsdp-readings check record them), and its memory or layout picture where the
last passing run recorded one. exit status: 0 written, 2 broken input (a guide that does not parse, say)"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXAMPLES
    parser.add_argument("out", type=Path, metavar="OUT", help="the directory to write the site into")
    add_common(parser)


@guarded
def run(args: argparse.Namespace, console: Console) -> int:
    if args.out.exists() and not args.out.is_dir():
        raise CommandProblem(f"{args.out} is a file", "give a directory to write the site into")
    started = time.perf_counter()
    session = open_session(args, console)
    if not session.guides:
        session.workspace.source.close()
        raise CommandProblem("no guide to write", "write a guide into the readings directory, or name one")
    try:
        built = build_site(session.guides, args.readings, session.workspace, args.out, session.guide_ids)
    finally:
        session.workspace.source.close()
    for problem in built.problems:
        console.print(Text(problem, style="yellow"))
    took = time.perf_counter() - started
    console.print(f"wrote {len(built.guides)} guide pages and the index in {took:.1f} s; open {display(built.index)}")
    return BROKEN if session.broken else CLEAN
