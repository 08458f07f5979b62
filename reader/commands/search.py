"""``fsdp-readings search WORD ...``: the guides, claims, notes, anchored symbols and glossary terms that mention
every word (case does not matter), each with the line of the guide it is on and the command that opens it.
Predict answers and explanations are not searched: they stay hidden until asked."""

from __future__ import annotations

import argparse

from rich.console import Console, Group
from rich.text import Text

from reader.commands.path import readings_found
from reader.format.errors import GuideError
from reader.format.hits import Hit, guide_hits, matches
from reader.format.parse import load_all
from reader.format.path import load_glossary
from reader.study.session import CLEAN, display
from reader.views.fit import indented
from reader.views.problem import guarded

EXAMPLES = """examples:
  fsdp-readings search prefetch
  fsdp-readings search reduce scatter        every word, in any order, in one place
  fsdp-readings search _post_backward_hook   an anchored symbol: the guides that read it

exit status: 0 something found, 1 nothing found, 2 broken input"""

SNIPPET = 100  # characters of a matching line shown


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXAMPLES
    parser.add_argument("words", nargs="+", metavar="WORD", help="words that must all appear")


@guarded
def run(args: argparse.Namespace, console: Console) -> int:
    readings = readings_found(args.readings)
    guides, _ = load_all([readings], None)
    words = [w.casefold() for w in args.words]
    hits = [hit for guide in sorted(guides, key=lambda g: (g.order, g.id)) for hit in guide_hits(guide, words)]
    try:
        terms = load_glossary(readings, [g.id for g in guides])
    except (GuideError, OSError):
        terms = ()
    glossary = display(readings / "glossary.toml")
    for term in terms:
        if matches(f"{term.term} {term.means}", words):
            hits.append(Hit("term", glossary, f"{term.term}: {term.means}", f"fsdp-readings glossary {term.term!r}"))
    if not hits:
        console.print(f"nothing mentions {' '.join(args.words)!r} (try fewer words, or fsdp-readings glossary)")
        return 1
    lines = [Text(f"{len(hits)} place(s) mention {' '.join(args.words)!r}", style="bold")]
    for hit in hits:
        lines.append(Text.assemble((f"{hit.kind:<8} ", "dim"), (hit.where, "cyan")))
        lines.append(indented(_snippet(hit.text, words), console.width, indent="  "))
        lines.append(indented(hit.open, console.width, "dim", indent="  "))
    console.print(Group(*lines), soft_wrap=False)
    return CLEAN


def _snippet(text: str, words: list[str]) -> str:
    """The part of ``text`` around the first word, whole words only."""
    flat = " ".join(text.split())
    if len(flat) <= SNIPPET:
        return flat
    at = flat.casefold().find(words[0])
    start = max(0, flat.rfind(" ", 0, max(0, at - SNIPPET // 3)) + 1)
    end = flat.find(" ", min(len(flat), start + SNIPPET))
    piece = flat[start : end if end > 0 else len(flat)]
    return ("... " if start else "") + piece + (" ..." if end > 0 else "")
