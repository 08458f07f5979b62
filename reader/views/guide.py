r"""A guide as a reader meets it in the terminal: prose as Markdown, each ``source`` block replaced by the live
torch code it names (syntax-highlighted, with torch's own line numbers) and its notes pinned to their lines,
each ``expect`` block shown as the data its claims check, and any other region (a fence kind registered
outside the reader's core) as its Markdown source, verbatim.

Small renderables composed by `render_guide`; `print_guide` is how ``fsdp-readings show`` prints them. Prose and
notes wrap at the console's width at word boundaries. A quoted line of torch that does not fit continues on rows
marked ``↪`` in the number column, indented past the line's own indentation, so a continuation never passes for a
line of its own. A diagram (a fenced block in the prose) is never wrapped, which would scramble its columns: a row
wider than the console is cropped and ends in ``…``.

What Markdown would misread is shown as written: a note that starts like a list item ("42. ...") stays a
sentence, torch's reStructuredText roles (``:meth:`next_iter` ``) and spaced literals (````_handle`` 's``) keep
their backticks. A ``|`` inside a table cell is written ``\|``, as GitHub needs it, and shown as ``|``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.markdown import CodeBlock, Markdown, MarkdownElement
from rich.padding import Padding
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from checks.breakit.exercises import exercise_modules
from reader.format.guide import ClaimSpec, ExpectBlock, Guide, Prose, SourceBlock, block_reference
from reader.format.predict import LISTS, PredictQuestion
from reader.gate.workspace import Workspace
from reader.source.anchors import Resolution
from reader.source.checkref import CheckFinder
from reader.views.fit import with_code
from reader.views.quote import BrokenQuote, PinnedNote, quote

_CODE_THEME = "ansi_dark"
CONTINUED = "↪"  # in the number column: this row continues the numbered line above
CROPPED = "…"  # the last cell of a diagram row cut at the console's edge
_HANG = 4  # a continuation's indentation past its line's own


# --- Markdown, shown as written ---------------------------------------------------------------------------------

# A reStructuredText role as torch's docstrings write it, :meth:`next_iter`: Markdown would show `next_iter` as code
# and drop the backticks, leaving ":meth:next_iter".
_RST_ROLE = re.compile(r"(?<![`\w]):[a-z]+(?::[a-z]+)?:`[^`\n]+`")
# An inline literal that reStructuredText had to space off from the letters after it (``_handle`` 's,
# ``FlatParameter`` s): shown as code, it reads "_handle 's".
_RST_SPACED_LITERAL = re.compile(r"(?<!`)``([^`\n]+)``(?= 's\b| s\b)")
# The start of a line that Markdown would make a list item, a heading or a quote, inside a note's sentence.
_BLOCK_MARKER = re.compile(r"^(\s*)(\d+)([.)])(?=\s)|^(\s*)([-+*>]|#{1,6})(?=\s)", re.MULTILINE)


def verbatim_rst(text: str) -> str:
    """``text`` with torch's reStructuredText markup put inside code spans that keep its backticks."""
    text = _RST_ROLE.sub(lambda m: f"`` {m.group(0)} ``", text)
    return _RST_SPACED_LITERAL.sub(lambda m: f"``` ``{m.group(1)}`` ```", text)


def sentence_markdown(text: str) -> str:
    """A note's text as Markdown that stays one paragraph: a line may start with "42." or "- " in a sentence."""

    def escape(match: re.Match[str]) -> str:
        if match.group(2) is not None:
            return f"{match.group(1)}{match.group(2)}\\{match.group(3)}"
        return f"{match.group(4)}\\{match.group(5)}"

    return _BLOCK_MARKER.sub(escape, text)


@dataclass(frozen=True)
class CroppedRows:
    """Rows shown at their own line breaks: a row wider than the room it is given is cropped and ends in
    `CROPPED`, because wrapping it would scramble the columns of a diagram or a table of values. The guides keep
    every such row within 78 cells (``tests/reader/test_fits_80_columns.py``), so at 80 columns nothing is cropped;
    cropping is the fallback for narrower terminals."""

    rows: tuple[Text, ...]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        room = max(options.max_width, 1)
        shown = []
        for written in self.rows:
            row = written.copy()
            row.rstrip()
            if row.cell_len > room:
                row.truncate(room - 1)
                row.append(CROPPED, style="dim")
            shown.append(row)
        line = Text("\n").join(shown)
        line.no_wrap, line.overflow = True, "ignore"
        yield line


class CroppedCodeBlock(CodeBlock):
    """A fenced block of the prose (a diagram, a table drawn in text) at its own line breaks, with one cell of
    padding each side as rich's own code block has: rows of 78 cells fit at 80 columns (`CroppedRows`)."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        code = str(self.text).rstrip()
        highlighted = Syntax(code, self.lexer_name, theme=self.theme).highlight(code)
        highlighted.rstrip()
        rows = CroppedRows(tuple(highlighted.split("\n", allow_blank=True)))
        yield Padding(rows, (1, 1), style="markdown.code_block", expand=False)


class GuideMarkdown(Markdown):
    """rich's Markdown with the guide's conventions: diagrams cropped, never wrapped (`CroppedCodeBlock`), and
    torch's reStructuredText shown with its backticks (`verbatim_rst`). A table cell's ``\\|`` is already a
    ``|``, in code too: markdown-it reads tables as GitHub does."""

    elements: ClassVar[dict[str, type[MarkdownElement]]] = {
        **Markdown.elements,
        "fence": CroppedCodeBlock,
        "code_block": CroppedCodeBlock,
    }

    def __init__(self, markup: str, **kwargs: object) -> None:
        super().__init__(verbatim_rst(markup), **kwargs)  # type: ignore[arg-type]


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
            yield GuideMarkdown(region.text)
        elif isinstance(region, SourceBlock):
            yield source_panel(guide, region, workspace)
        elif isinstance(region, ExpectBlock):
            yield expect_panel(guide, region)
        elif isinstance(region, PredictQuestion):
            yield predict_panel(region, answers=answers)
        else:  # a region of a fence kind registered elsewhere (reader.format.body): its Markdown, verbatim
            yield Text(guide.raw(region))
    yield claims_table(guide, exercises_by_claim(guide))


def exercises_by_claim(guide: Guide) -> dict[str, list[str]]:
    """Claim id → the ids of the exercises whose patch breaks it, read from the guide's check modules."""
    finder = CheckFinder(extra_paths=[guide.path.resolve().parent.parent])
    found: dict[str, list[str]] = {}
    for module in exercise_modules(claim.check.split(":")[0] for claim in guide.claims):
        for exercise, claim in finder.exercises(module):
            found.setdefault(claim, []).append(exercise)
    return found


def _header(guide: Guide, workspace: Workspace) -> RenderableType:
    version = workspace.torch_version or "unknown version"
    title = Text.assemble((guide.title, "bold"), f"\n{guide.id} · torch {guide.torch} · read against {version}")
    return Panel(title, border_style="cyan")


def source_panel(guide: Guide, block: SourceBlock, workspace: Workspace) -> RenderableType:
    """The anchor's live code with its notes: the heart of a reading guide. The quote is cut after each line a
    note pins and the note is shown right there, so notes read in line order next to their code. The cuts come
    from `reader.views.quote.quote`, which the site's pages render from too."""
    quoted = quote(guide, block, workspace)
    if isinstance(quoted, BrokenQuote):
        body = Text(f"{quoted.symbol}\n{quoted.error.render()}", style="red")
        return Panel(body, title=Text(quoted.name, style="bold"), border_style="red", title_align="left")
    code = QuotedCode.of(quoted.found, set(quoted.highlighted))
    parts: list[RenderableType] = []
    for segment in quoted.segments:
        parts.append(code.lines(segment.first, segment.last))
        if segment.notes:
            parts.append(notes_table(segment.notes))
    if quoted.lost:
        parts.append(notes_table(quoted.lost))
    style = "green" if quoted.ok else "yellow"
    return SourcePanel(quoted.name, quoted.location, quoted.qualname, quoted.status, style, parts)


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


@dataclass(frozen=True)
class QuotedCode:
    """An anchor's lines, highlighted once as a whole (so a segment that starts inside a docstring is still
    highlighted as one), cut into the segments a panel shows between its notes."""

    rows: tuple[Text, ...]  # one per file line, from ``start``
    start: int
    highlighted: frozenset[int]

    @classmethod
    def of(cls, found: Resolution, highlighted: set[int]) -> QuotedCode:
        # A resolution's text ends with one newline, which is no line of the anchor.
        code = found.text.removesuffix("\n")
        text = Syntax(code, "python", theme=_CODE_THEME).highlight(code)
        rows = list(text.split("\n", allow_blank=True))[: found.end - found.start + 1]
        rows += [Text() for _ in range(found.end - found.start + 1 - len(rows))]
        for row in rows:
            row.rstrip()
        return cls(tuple(rows), found.start, frozenset(highlighted))

    def lines(self, first: int, last: int) -> NumberedLines:
        return NumberedLines(self, first, last)

    @property
    def number_width(self) -> int:
        """The numbers column is as wide in every segment: as wide as the anchor's last line number."""
        return len(str(self.start + len(self.rows) - 1))


@dataclass(frozen=True)
class NumberedLines:
    """File lines ``first``..``last`` of a quote, each behind a marker (``❱`` for a line a note pins) and its
    number. A line wider than the panel continues on rows marked `CONTINUED`, indented `_HANG` cells past the
    line's own indentation, and breaking at a space where there is one."""

    code: QuotedCode
    first: int
    last: int

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = self.code.number_width
        room = max(options.max_width - width - 3, 8)  # marker (2), number, one space
        for number in range(self.first, self.last + 1):
            row = self.code.rows[number - self.code.start]
            marker = Text("❱ ", style="bold red") if number in self.code.highlighted else Text("  ")
            pieces = _wrap_code(row, room)
            yield Text.assemble(marker, (f"{number:>{width}} ", "dim"), pieces[0])
            for piece in pieces[1:]:
                yield Text.assemble("  ", (f"{CONTINUED:>{width}} ", "dim"), piece)


def _wrap_code(row: Text, room: int) -> list[Text]:
    """``row`` cut into pieces of at most ``room`` cells: the first as it is, the rest after the line's own
    indentation plus `_HANG`. A piece ends at a space when one is past the indentation, else mid-token."""
    plain = row.plain
    if len(plain) <= room:
        return [row]
    indent = len(plain) - len(plain.lstrip())
    hang = min(indent + _HANG, room // 2)
    pieces, at, limit = [], 0, room
    while len(plain) - at > limit:
        cut = plain.rfind(" ", at + 1, at + limit + 1)
        if cut <= at + max(indent - at, 0):
            cut = at + limit
        pieces.append(row[at:cut])
        at = cut
        while at < len(plain) and plain[at] == " ":
            at += 1
        limit = room - hang
    pieces.append(row[at:])
    return [pieces[0], *(Text.assemble(" " * hang, piece) for piece in pieces[1:])]


def notes_table(notes: Sequence[PinnedNote]) -> RenderableType:
    table = Table(show_header=False, box=None, pad_edge=False, expand=True)
    table.add_column("line", style="bold cyan", no_wrap=True, justify="right")
    table.add_column("note", ratio=1)
    for pinned in notes:
        scope = f"*(torch {pinned.note.torch})* " if pinned.note.torch is not None else ""
        table.add_row(pinned.label, GuideMarkdown(scope + sentence_markdown(pinned.note.text)))
    return Padding(table, (0, 0, 0, 2))


def expect_panel(guide: Guide, block: ExpectBlock) -> RenderableType:
    """The block's items, one per row as written, between a rule titled with its name and one naming the claims
    that check it. The rules have no sides, so a row has the room a diagram's has (78 cells at 80 columns); a
    wider row is cropped (`CroppedRows`), never wrapped into the row below."""
    users = [c.id for c in guide.claims for v in c.kwargs.values() if block_reference(v) == block.name]
    checked = f"checked by claim {', '.join(users)}" if users else "not used by any claim"
    rows = CroppedRows(tuple(Text(item) for item in block.items))
    return Panel(
        rows,
        title=f"expected: {block.name}",
        subtitle=checked,
        title_align="left",
        subtitle_align="left",
        box=box.HORIZONTALS,
        padding=(0, 0),
    )


def predict_panel(question: PredictQuestion, *, answers: bool = False) -> RenderableType:
    """The question (and its choices, lettered); the answer and why only when asked for."""
    parts: list[RenderableType] = [GuideMarkdown(question.question)]
    parts += [Text(f"  {chr(ord('a') + i)}) {choice}") for i, choice in enumerate(question.choices)]
    if answers:
        shown = ", ".join(question.answer) if question.kind in LISTS else str(question.answer)
        parts += [Text.assemble(("answer: ", "bold green"), shown), Text(question.explain, style="green")]
    subtitle = f"revealed by claim {question.claim}"
    return Panel(Group(*parts), title=f"predict: {question.id} ({question.kind})", title_align="left",
                 subtitle=subtitle, subtitle_align="right")  # fmt: skip


def view_commands(guide: Guide, claim: ClaimSpec, exercises: Mapping[str, list[str]] | None = None) -> list[str]:
    """The commands that draw a claim's run: one per declared view, one per exercise of it."""
    commands = [f"fsdp-readings {view} {guide.id} {claim.id}" for view in claim.views]
    commands += [f"fsdp-readings exercise {guide.id} {ex}" for ex in (exercises or {}).get(claim.id, [])]
    return commands


def claims_table(guide: Guide, exercises: Mapping[str, list[str]] | None = None) -> RenderableType:
    """Each claim as its id and rank count, then the statement at nearly the full width, then its check on a
    line of its own (a check's dotted path is long, and a column for it starved the statement), then the views
    of its run as commands to paste (the ones its ``views`` declare, and its exercises), and the command that runs
    them all from any directory."""
    parts: list[RenderableType] = [Text(f"\nClaims of {guide.id}", style="bold")]
    for claim in guide.claims:
        head = Text.assemble(("▸ ", "cyan"), (claim.id, "bold"), (f" · {claim.world_size} ranks", "dim"))
        lines: list[RenderableType] = [
            with_code(claim.statement),
            Text.assemble(("check ", "dim"), (claim.check, "dim"), overflow="fold"),
        ]
        lines += [Text(command, style="green", overflow="fold") for command in view_commands(guide, claim, exercises)]
        parts += [head, Padding(Group(*lines), (0, 0, 1, 4))]
    parts.append(Text(f"run them: fsdp-readings check {guide.id}", style="dim", overflow="fold"))
    return Group(*parts)
