"""The reading path drawn: the tracks in order with where to start (``fsdp-readings`` with no command), the
line that says which guide comes next, and a glossary term."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rich.console import Console, Group, RenderableType
from rich.text import Text

from reader.format.guide import Guide
from reader.format.path import ReadingPath, Term, reading_path
from reader.views.fit import indented

COMMANDS_IN_ORDER = (
    ("show GUIDE", "read it: prose, the torch source quoted live, notes on the lines"),
    ("predict GUIDE", "answer its questions first; a real run reveals each answer"),
    ("check GUIDE", "run its claims on the rank pool"),
    ("timeline GUIDE CLAIM", "what one claim's run made FSDP do, line by line"),
    ("exercise GUIDE", "a break-it patch as a puzzle"),
    ("list", "where you stand on every guide"),
)


def path_view(guides: list[Guide], path: ReadingPath, width: int) -> RenderableType:
    titles = {g.id: g.title for g in guides}
    lines: list[RenderableType] = [
        Text("fsdp-readings: reading guides over PyTorch FSDP's source", style="bold"),
        indented(f"Start here: fsdp-readings show {path.start}", width, "bold green", indent=""),
        Text(""),
    ]
    for number, track in enumerate(path.tracks, start=1):
        lines.append(Text(f"{number}. {track.name}", style="bold"))
        if track.about:
            lines.append(indented(track.about, width, "dim", indent="   "))
        for guide_id in track.guides:
            lines.append(Text(f"   {guide_id}", style="cyan"))
            lines.append(indented(titles.get(guide_id, ""), width, indent="      "))
        lines.append(Text(""))
    lines.append(Text("Then, for each guide:", style="bold"))
    for command, what in COMMANDS_IN_ORDER:
        lines.append(Text(f"   fsdp-readings {command}", style="bold"))
        lines.append(indented(what, width, "dim", indent="      "))
    lines.append(indented("fsdp-readings COMMAND --help: options and examples of each command", width, "dim", ""))
    return Group(*lines)


def print_next(console: Console, readings: Path, guide_id: str, guide_ids: Iterable[str] | None = None) -> None:
    """End a guide's ``show``, ``check`` or ``predict`` with the guide to read next (nothing off the path);
    ``guide_ids``: every guide's, when the command has parsed them."""
    shown = next_view(reading_path(readings, guide_ids), guide_id)
    if shown is not None:
        console.print(shown, soft_wrap=False)


def print_read_next(console: Console, guide_id: str) -> None:
    """End ``predict``: the answers are given, so the next step is reading the guide they were about."""
    console.print(Group(
        Text.assemble(("next: ", "bold"), "read ", (guide_id, "cyan"), ", whose answers you just predicted"),
        Text(f"  fsdp-readings show {guide_id}", style="dim"),
    ), soft_wrap=False)  # fmt: skip


def next_view(path: ReadingPath | None, guide_id: str) -> RenderableType | None:
    """What a guide's ``show``, ``check`` or ``predict`` ends with: the guide to read next, and how to open it."""
    if path is None or path.place(guide_id) is None:
        return None
    following = path.after(guide_id)
    if following is None:
        return Text("That was the last guide of the path.", style="dim")
    next_id, track, position = following
    where = f"{track.name}, {position + 1} of {len(track.guides)}"
    return Group(
        Text.assemble(("next: ", "bold"), (next_id, "cyan"), f" ({where})"),
        Text(f"  fsdp-readings show {next_id}", style="dim"),
    )


def term_view(term: Term, width: int) -> RenderableType:
    return Group(
        Text(term.term, style="bold"),
        indented(term.means, width),
        indented(f"see: fsdp-readings show {term.see}", width, "dim"),
    )
