"""Every diagram, text table, code example and expect row of every guide fits 78 cells as written, so a reader
at 80 columns loses nothing: ``show`` draws such rows with one cell of room each side and crops, never wraps, a
wider one (`reader.views.guide.CroppedRows`), and what it would crop is often the result.

Checked on the files as written, every torch scope included (a block shown only on 2.15 is read here on any
torch); `test_show_width.py` checks the rendered guides of the installed torch crop nothing at 80 columns.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from rich.cells import cell_len

from reader.commands.app import make_console
from reader.format.guide import ExpectBlock, Guide, Prose
from reader.format.parse import load_guide, looks_like_guide
from reader.views import guide as guide_view
from reader.views.guide import GuideMarkdown, expect_panel

READINGS = Path(__file__).resolve().parents[2] / "readings"
GUIDES = sorted(path for path in READINGS.glob("[0-9][0-9]-*.md") if looks_like_guide(path))
ROOM = 78  # 80 columns less the cell of room each side
_MARKDOWN = MarkdownIt().enable("strikethrough").enable("table")  # rich.markdown's parser


@dataclass(frozen=True)
class WideRow:
    line: int  # in the guide's file
    cells: int
    kind: str  # "fence", "indented code" or "expect <name>"

    def __str__(self) -> str:
        return f"line {self.line}: {self.kind} row of {self.cells} cells"


def wide_rows(guide: Guide, room: int = ROOM) -> list[WideRow]:
    """The rows of ``guide`` that ``show`` draws at their own line breaks and that are wider than ``room``:
    fenced and indented code in the prose, and every expect block's items, whatever torch they are for."""
    file_lines = guide.text.split("\n")
    found: list[WideRow] = []  # a fence's rows are counted from its content, an indented block's after the indent
    for region in guide.regions:
        if isinstance(region, Prose):
            for token in _MARKDOWN.parse(region.text):
                if token.type not in ("fence", "code_block") or token.map is None:
                    continue
                kind = "fence" if token.type == "fence" else "indented code"
                first = region.start + token.map[0] + (1 if token.type == "fence" else 0)
                for offset, row in enumerate(token.content.rstrip("\n").split("\n")):
                    if cell_len(row) > room:
                        found.append(WideRow(first + offset, cell_len(row), kind))
        elif isinstance(region, ExpectBlock):
            for line in range(region.start + 1, region.end):
                row = file_lines[line - 1].rstrip()
                if cell_len(row) > room:
                    found.append(WideRow(line, cell_len(row), f"expect {region.name}"))
    return found


@pytest.mark.parametrize("path", GUIDES, ids=lambda path: path.stem)
def test_every_drawn_row_fits_78_cells_as_written(path: Path) -> None:
    wide = wide_rows(load_guide(path))
    assert not wide, f"{path.name}: redraw these rows within {ROOM} cells: " + "; ".join(map(str, wide))


# --- the rule and the renderer agree, and the test can fail ------------------------------------------------

ROW_78 = "x" * 77 + "!"
ROW_79 = "y" * 78 + "?"
SAMPLE = f"""+++
id = "99-sample"
title = "Sample"
order = 99
torch = ">=2.13"
+++
# Sample

A diagram:

```
{ROW_78}
{ROW_79}
```

Indented:

    {ROW_79}

```expect rows lines
{ROW_78}
{ROW_79}
```
"""


@pytest.fixture
def sample(tmp_path: Path) -> Guide:
    path = tmp_path / "99-sample.md"
    path.write_text(SAMPLE)
    return load_guide(path)


def test_rows_of_79_cells_are_found_where_they_are_written(sample: Guide) -> None:
    lines = SAMPLE.split("\n")
    wide = wide_rows(sample)
    assert [(row.kind, row.cells) for row in wide] == [("fence", 79), ("indented code", 79), ("expect rows", 79)]
    for row in wide:
        assert ROW_79 in lines[row.line - 1]


def _rendered(renderable: object, width: int, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(guide_view, "CROPPED", "\ue000")  # a cropped row ends in this, and nothing else does
    buffer = io.StringIO()
    make_console(file=buffer, width=width, force_terminal=False, color_system=None).print(renderable)
    return buffer.getvalue()


@pytest.mark.parametrize("width", [80, 100])
def test_show_keeps_a_78_cell_row_whole_and_crops_a_79_cell_row_at_80(
    sample: Guide, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    prose = next(region for region in sample.regions if isinstance(region, Prose))
    for renderable in (GuideMarkdown(prose.text), expect_panel(sample, sample.expect_blocks()["rows"])):
        out = _rendered(renderable, width, monkeypatch)
        assert ROW_78 in out
        assert (ROW_79 in out) == (width == 100)
        assert ("\ue000" in out) == (width == 80)
        assert max(cell_len(line) for line in out.splitlines()) <= width
