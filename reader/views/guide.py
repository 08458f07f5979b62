"""A guide as a reader meets it in the terminal: prose as Markdown, each ``source`` block replaced by the live
torch code it names (syntax-highlighted, with torch's own line numbers) and its notes pinned to their lines,
each ``expect`` block shown as the data its claims check, and any other region (a fence kind registered
outside the reader's core) as its Markdown source, verbatim.

Small renderables composed by `render_guide`; `print_guide` is how ``fsdp-readings show`` prints them. Everything
wraps at the console's width (prose at word boundaries, long code lines onto continuation lines under a blank
line number), so nothing runs past the edge and nothing is cropped.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.markdown import Markdown
from rich.padding import Padding
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from reader.format.guide import ExpectBlock, Guide, Note, Prose, SourceBlock, block_reference
from reader.format.predict import PredictQuestion
from reader.gate.workspace import Workspace
from reader.source.anchors import AnchorError, NoteMatch, Resolution
from reader.source.patterns import find

_OK_DRIFT = {"unchanged", "moved", "cosmetic"}
_CODE_THEME = "ansi_dark"


def print_guide(console: Console, guide: Guide, workspace: Workspace, *, answers: bool = False) -> None:
    """Print a guide the way ``show`` does. Always word-wrapped at the console's width, even on a console
    whose default is soft wrapping (the CLI's, for long paths in other commands): soft-wrapped prose breaks
    mid-word wherever the terminal folds it, and anything inside a panel or list is cropped at the edge."""
    for renderable in render_guide(guide, workspace, answers=answers):
        console.print(renderable, soft_wrap=False)


def render_guide(guide: Guide, workspace: Workspace, *, answers: bool = False) -> Iterator[RenderableType]:
    """Everything the reader sees, in document order; predict answers only with ``answers``."""
    yield _header(guide, workspace)
    for region in guide.regions:
        if isinstance(region, Prose):
            yield Markdown(region.text)
        elif isinstance(region, SourceBlock):
            yield source_panel(guide, region, workspace)
        elif isinstance(region, ExpectBlock):
            yield expect_panel(guide, region)
        elif isinstance(region, PredictQuestion):
            yield predict_panel(region, answers=answers)
        else:  # a region of a fence kind registered elsewhere (reader.format.body): its Markdown, verbatim
            yield Text(guide.raw(region))
    yield claims_table(guide, workspace.display(guide.path))


def _header(guide: Guide, workspace: Workspace) -> RenderableType:
    version = workspace.torch_version or "unknown version"
    title = Text.assemble((guide.title, "bold"), f"\n{guide.id} · torch {guide.torch} · read against {version}")
    return Panel(title, border_style="cyan")


@dataclass(frozen=True)
class PinnedNote:
    """A note with where it landed: ``match.line`` is the file line its pattern starts on (what the label cites
    and the quote marks), ``after`` the line the note is shown under (see `pin_notes`)."""

    note: Note
    match: NoteMatch
    after: int

    @property
    def pinned(self) -> bool:
        return self.match.count == 1

    @property
    def label(self) -> str:
        if self.pinned:
            return f"L{self.match.line} ▸"
        return "not found ▸" if self.match.count == 0 else f"×{self.match.count} ▸"


def pin_notes(block_notes: Sequence[Note], found: Resolution, matches: Sequence[NoteMatch]) -> list[PinnedNote]:
    """The block's notes in the order they are shown: pinned ones by line (ties in note order), each placed
    after the last line its pattern covers, but never before a note of an earlier line (so the notes read in
    line order even when a multi-line match encloses the next note's line); then, in note order, the ones
    that land nowhere or in several places."""
    pinned: list[tuple[int, int, Note, NoteMatch, int]] = []
    lost: list[PinnedNote] = []
    for index, (note, match) in enumerate(zip(block_notes, matches, strict=True)):
        if match.count != 1:
            lost.append(PinnedNote(note, match, found.end))
            continue
        (only,) = find(found.text, note.pattern)
        pinned.append((match.line, index, note, match, found.start + only.end[0] - 1))
    shown: list[PinnedNote] = []
    after = found.start
    for line, _, note, match, last in sorted(pinned, key=lambda p: (p[0], p[1])):
        after = min(max(after, line, last), found.end)
        shown.append(PinnedNote(note, match, after))
    return shown + lost


def source_panel(guide: Guide, block: SourceBlock, workspace: Workspace) -> RenderableType:
    """The anchor's live code with its notes: the heart of a reading guide. The quote is cut after each line a
    note pins and the note is shown right there, so notes read in line order next to their code."""
    anchor = guide.anchor(block.anchor)
    found = workspace.current(anchor)
    if isinstance(found, AnchorError):
        body = Text(f"{anchor.symbol}\n{found.render()}", style="red")
        return Panel(body, title=Text(anchor.name, style="bold"), border_style="red", title_align="left")
    shown_notes = block.notes_for(workspace.torch_version)
    matches = workspace.resolver.notes(found, [note.pattern for note in shown_notes])
    notes = pin_notes(shown_notes, found, matches)
    highlighted = {p.match.line for p in notes if p.pinned}
    code = _code(found)

    parts: list[RenderableType] = []
    first = found.start
    for after in sorted({p.after for p in notes if p.pinned}):
        parts.append(_lines(code, found, first, after, highlighted))
        parts.append(notes_table([p for p in notes if p.pinned and p.after == after]))
        first = after + 1
    if first <= found.end:
        parts.append(_lines(code, found, first, found.end, highlighted))
    lost = [p for p in notes if not p.pinned]
    if lost:
        parts.append(notes_table(lost))

    drift = workspace.drift(guide, anchor)
    status = drift.kind.value
    style = "green" if status in _OK_DRIFT else "yellow"
    return SourcePanel(anchor.name, found.span(), anchor.qualname or anchor.symbol, status, style, parts)


@dataclass(frozen=True)
class SourcePanel:
    """A quote's panel, titled ``<anchor> · torch/distributed/fsdp/<file>.py:<first>-<last>`` (relative to
    the directory holding torch/: an absolute venv path pushed the file name and the lines off the title)
    and subtitled ``<qualified name> · <drift status>`` (the module is in the path). What does not fit on the
    border at the width it is drawn at moves to a line of its own at the top, where it wraps: a panel's
    border is cropped, never wrapped."""

    name: str
    location: str
    qualname: str
    status: str
    style: str
    parts: list[RenderableType]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        room = options.max_width - 6  # the corners, a rule character each side, a space around the title
        title = Text.assemble((self.name, "bold"), f" · {self.location}")
        subtitle = Text(f"{self.qualname} · {self.status}", style=self.style)
        moved = []
        if title.cell_len > room:
            title, moved = Text(self.name, style="bold"), [self.location]
        if subtitle.cell_len > room:
            subtitle = Text(self.status, style=self.style)
            moved.append(self.qualname)
        parts = [Text(" · ".join(moved), style="dim"), *self.parts] if moved else self.parts
        yield Panel(Group(*parts), title=title, subtitle=subtitle, border_style=self.style, title_align="left")


def _code(found: Resolution) -> str:
    # A resolution's text ends with one newline; given to Syntax it would show as an extra blank line numbered
    # one past the anchor's end (where the file may well hold code).
    return found.text.removesuffix("\n")


def _lines(code: str, found: Resolution, first: int, last: int, highlighted: set[int]) -> Syntax:
    """File lines ``first``..``last`` of the anchor. The whole anchor is lexed each time (so a segment that
    starts inside a docstring is still highlighted as one), and the numbers column is as wide in every
    segment."""
    return Syntax(
        code,
        "python",
        line_numbers=True,
        start_line=found.start,
        line_range=(first - found.start + 1, last - found.start + 1),
        highlight_lines=highlighted,
        word_wrap=True,
        theme=_CODE_THEME,
    )


def notes_table(notes: Sequence[PinnedNote]) -> RenderableType:
    table = Table(show_header=False, box=None, pad_edge=False, expand=True)
    table.add_column("line", style="bold cyan", no_wrap=True, justify="right")
    table.add_column("note", ratio=1)
    for pinned in notes:
        scope = f"*(torch {pinned.note.torch})* " if pinned.note.torch is not None else ""
        table.add_row(pinned.label, Markdown(scope + pinned.note.text))
    return Padding(table, (0, 0, 0, 2))


def expect_panel(guide: Guide, block: ExpectBlock) -> RenderableType:
    users = [c.id for c in guide.claims for v in c.kwargs.values() if block_reference(v) == block.name]
    checked = f"checked by claim {', '.join(users)}" if users else "not used by any claim"
    return Panel(Text("\n".join(block.items)), title=f"expected: {block.name}", subtitle=checked, title_align="left")


def predict_panel(question: PredictQuestion, *, answers: bool = False) -> RenderableType:
    """The question (and its choices, lettered); the answer and why only when asked for."""
    parts: list[RenderableType] = [Markdown(question.question)]
    parts += [Text(f"  {chr(ord('a') + i)}) {choice}") for i, choice in enumerate(question.choices)]
    if answers:
        shown = ", ".join(question.answer) if question.kind == "order" else str(question.answer)
        parts += [Text.assemble(("answer: ", "bold green"), shown), Text(question.explain, style="green")]
    subtitle = f"revealed by claim {question.claim}"
    return Panel(Group(*parts), title=f"predict: {question.id} ({question.kind})", title_align="left",
                 subtitle=subtitle, subtitle_align="right")  # fmt: skip


def claims_table(guide: Guide, path: str | None = None) -> RenderableType:
    """Each claim as its id and rank count, then the statement at nearly the full width, then its check on a
    line of its own (a check's dotted path is long, and a column for it starved the statement)."""
    parts: list[RenderableType] = [Text(f"\nClaims of {guide.id}", style="bold")]
    for claim in guide.claims:
        head = Text.assemble(("▸ ", "cyan"), (claim.id, "bold"), (f" · {claim.world_size} ranks", "dim"))
        body = Group(
            Text(claim.statement),
            Text.assemble(("check ", "dim"), (claim.check, "dim"), overflow="fold"),
        )
        parts += [head, Padding(body, (0, 0, 1, 4))]
    parts.append(Text(f"run them: pytest {path or guide.path} -k claim", style="dim", overflow="fold"))
    return Group(*parts)
