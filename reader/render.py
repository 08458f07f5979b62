"""A guide as a reader meets it in the terminal: prose as Markdown, each ``source`` block replaced by the live
torch code it names (syntax-highlighted, with torch's own line numbers) and its notes pinned to their lines,
each ``expect`` block shown as the data its claims check, and any other region (a fence kind registered
outside the reader's core) as its Markdown source, verbatim.

Small renderables composed by `render_guide`; nothing here prints.
"""

from __future__ import annotations

from collections.abc import Iterator

from rich.console import Group, RenderableType
from rich.markdown import Markdown
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from reader.anchors import AnchorError
from reader.guide import ExpectBlock, Guide, Prose, SourceBlock, block_reference
from reader.workspace import Workspace

_OK_DRIFT = {"unchanged", "moved", "cosmetic"}


def render_guide(guide: Guide, workspace: Workspace) -> Iterator[RenderableType]:
    """Everything the reader sees, in document order."""
    yield _header(guide, workspace)
    for region in guide.regions:
        if isinstance(region, Prose):
            yield Markdown(region.text)
        elif isinstance(region, SourceBlock):
            yield source_panel(guide, region, workspace)
        elif isinstance(region, ExpectBlock):
            yield expect_panel(guide, region)
        else:  # a region of a fence kind registered elsewhere (reader.body): its Markdown, verbatim
            yield Text(guide.raw(region))
    yield claims_table(guide)


def _header(guide: Guide, workspace: Workspace) -> RenderableType:
    version = workspace.torch_version or "unknown version"
    title = Text.assemble((guide.title, "bold"), f"\n{guide.id} · torch {guide.torch} · read against {version}")
    return Panel(title, border_style="cyan")


def source_panel(guide: Guide, block: SourceBlock, workspace: Workspace) -> RenderableType:
    """The anchor's live code with its notes: the heart of a reading guide."""
    anchor = guide.anchor(block.anchor)
    found = workspace.current(anchor)
    if isinstance(found, AnchorError):
        body = Text(found.render(), style="red")
        return Panel(body, title=f"{anchor.name} · {anchor.symbol}", border_style="red")
    matches = workspace.resolver.notes(found, [note.pattern for note in block.notes])
    note_lines = {match.line for match in matches if match.count == 1}
    code = Syntax(
        found.text,
        "python",
        line_numbers=True,
        start_line=found.start,
        highlight_lines=note_lines,
        word_wrap=False,
        theme="ansi_dark",
    )
    drift = workspace.drift(guide, anchor)
    status = drift.kind.value
    style = "green" if status in _OK_DRIFT else "yellow"
    title = Text.assemble((anchor.name, "bold"), f" · {found.display_path}:{found.start}-{found.end}")
    subtitle = Text(f"{anchor.symbol} · {status}", style=style)
    parts: list[RenderableType] = [code]
    if block.notes:
        parts.append(notes_table(block, matches))
    return Panel(Group(*parts), title=title, subtitle=subtitle, border_style=style, title_align="left")


def notes_table(block: SourceBlock, matches: list) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False, expand=True)
    table.add_column("line", style="cyan", no_wrap=True, justify="right")
    table.add_column("note", ratio=1)
    for note, match in zip(block.notes, matches, strict=True):
        where = f"L{match.line}" if match.count == 1 else ("not found" if match.count == 0 else f"×{match.count}")
        table.add_row(f"{where} ▸", Markdown(note.text))
    return table


def expect_panel(guide: Guide, block: ExpectBlock) -> RenderableType:
    users = [c.id for c in guide.claims for v in c.kwargs.values() if block_reference(v) == block.name]
    checked = f"checked by claim {', '.join(users)}" if users else "not used by any claim"
    return Panel(Text("\n".join(block.items)), title=f"expected: {block.name}", subtitle=checked, title_align="left")


def claims_table(guide: Guide) -> RenderableType:
    table = Table(title=f"Claims of {guide.id}", title_justify="left", expand=True)
    table.add_column("claim", style="bold", no_wrap=True)
    table.add_column("statement", ratio=1)
    table.add_column("check", style="dim")
    for claim in guide.claims:
        table.add_row(claim.id, claim.statement, f"{claim.check}\n{claim.world_size} ranks")
    run = f"pytest {guide.path} -k claim"
    return Group(table, Text(f"run them: {run}", style="dim"))
