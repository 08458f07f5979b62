"""`fsdp-readings show` defects two readers found in guides 06–18, each pinned by a test that failed before its fix:
on a small guide over the synthetic torch tree, and where the defect was seen, on the real guide.

- ``|`` inside a table cell, written ``\\|`` as GitHub wants it, split guide 15's tables;
- a note starting "42." became an ordered list (guide 12);
- reStructuredText roles and spaced literals lost their backticks (":meth:next_iter", "_handle 's");
- a note whose pattern spans two lines was labelled with its first line only (guides 10, 11);
- diagrams wider than the console wrapped, scrambling their columns ("◄── this" / "guide");
- guide 12's ``FlatParamHandle.__init__`` panel began at the ``# INITIALIZATION #`` banner above it.

(Long code lines continuing on unnumbered rows are `test_render.py`'s
``test_long_code_lines_continue_on_marked_rows_past_their_indentation``.)
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

from reader.commands.app import main, make_console
from reader.format.parse import parse_guide
from reader.gate.workspace import Workspace
from reader.views.guide import CROPPED, print_guide
from tests.reader.reader_support import PREFETCH_ANCHOR, guide, make_tree

pytestmark = pytest.mark.shared_index_cache  # renders the real guides; counts no cache

READINGS = Path(__file__).resolve().parents[2] / "readings"
RUNTIME = "torch/distributed/fsdp/_runtime_utils.py"
FLAT_PARAM = "torch/distributed/fsdp/_flat_param.py"
WIDTHS = (60, 80, 100)


def _render(tmp_path: Path, text: str, width: int = 100, edit: Callable | None = None) -> str:
    tree = make_tree(tmp_path / "site")
    if edit is not None:
        edit(tree)
    workspace = Workspace(tree.source(), tmp_path / "anchors.lock")
    buffer = io.StringIO()
    console = make_console(file=buffer, width=width, force_terminal=False, color_system=None)
    print_guide(console, parse_guide(text, tmp_path / "04-forward-prefetch.md"), workspace)
    return buffer.getvalue()


@cache
def _shown(guide_id: str, width: int) -> str:
    """A real guide as ``show`` prints it."""
    buffer = io.StringIO()
    console = make_console(file=buffer, width=width, force_terminal=False, color_system=None)
    assert main(["--readings", str(READINGS), "show", guide_id], console=console) == 0, buffer.getvalue()[-2000:]
    return buffer.getvalue()


def _squeezed(out: str) -> str:
    """The rendered text with panel edges and line breaks gone, so a wrapped sentence reads whole."""
    return " ".join(out.replace("│", " ").split())


# --- `|` in a table cell -------------------------------------------------------------------------------------


def test_an_escaped_pipe_in_a_table_cell_is_a_pipe_in_text_and_in_code(tmp_path: Path) -> None:
    body = "| strategy | ratio | formula |\n|---|---|---|\n| DDP | 1 | \\|θ\\| / `\\|θ\\|` |\n"
    out = _render(tmp_path, guide(anchors=PREFETCH_ANCHOR, body=body))
    row = next(line for line in out.splitlines() if "DDP" in line)
    assert "|θ| / |θ|" in row and "\\" not in row  # GitHub's reading: the backslash only escapes the pipe


def test_guide_15s_tables_keep_their_formulas_in_one_cell() -> None:
    out = _shown("15-communication-volume", 100)
    for formula in ("(3ΣP − P_root)/(2|θ|)", "3ΣP/(2|θ|) = 1.5", "(4ΣP − P_root)/(2|θ|) ≈ 1.966"):
        assert any(formula in line for line in out.splitlines()), formula
    text = READINGS.joinpath("15-communication-volume.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "θ" in line]
    assert rows and all("|θ|" not in row for row in rows)  # escaped, so GitHub does not split them either


# --- a note that starts with a number -------------------------------------------------------------------------


def test_a_note_starting_with_a_number_and_a_period_stays_a_sentence(tmp_path: Path) -> None:
    body = '```source prefetch\nnote "handle._prefetched = True": 42. The value\n    - of the padding.\n```\n'
    out = _render(tmp_path, guide(anchors=PREFETCH_ANCHOR, body=body))
    label = next(line for line in out.splitlines() if "▸" in line)
    assert re.search(r"L\d+ ▸  42\. The value - of the padding\.", label), label


def test_guide_12s_note_on_the_padding_value_reads_42() -> None:
    assert re.search(r"L\d+ ▸  42\. The slice property", _shown("12-flat-parameter", 100))


# --- reStructuredText quoted from torch -----------------------------------------------------------------------


def test_rst_roles_and_spaced_literals_keep_their_backticks(tmp_path: Path) -> None:
    body = (
        'The docstring says "reset in :meth:`next_iter`" and "Returns a :class:`list`".\n\n'
        '```source prefetch\nnote "if not current_handle:": it "Prepares ``_handle`` \'s ``FlatParameter`` s".\n'
        "```\n"
    )
    out = _squeezed(_render(tmp_path, guide(anchors=PREFETCH_ANCHOR, body=body)))
    assert '"reset in :meth:`next_iter`"' in out and '"Returns a :class:`list`"' in out
    assert '"Prepares ``_handle`` \'s ``FlatParameter`` s"' in out


def test_guides_06_and_07_quote_torchs_docstrings_as_torch_writes_them() -> None:
    assert '"the recorded order is reset in :meth:`next_iter`"' in _squeezed(_shown("06-backward-prefetch", 100))
    assert '"Prepares ``_handle`` \'s ``FlatParameter`` s"' in _squeezed(_shown("07-pre-backward", 100))


# --- a pattern over two lines ---------------------------------------------------------------------------------


def _line_of(source: str, needle: str) -> int:
    return next(i for i, line in enumerate(source.split("\n"), start=1) if needle in line)


def test_a_note_whose_pattern_spans_two_lines_is_labelled_with_both(tmp_path: Path) -> None:
    body = (
        '```source prefetch\nnote "return handle = _get_handle_to_prefetch": the pick, after the early return.\n```\n'
    )
    tree = make_tree(tmp_path / "site")
    out = _render(tmp_path, guide(anchors=PREFETCH_ANCHOR, body=body))
    handle = _line_of(tree.read(RUNTIME), "handle = _get_handle_to_prefetch(")
    first = handle - 1
    label = next(line for line in out.splitlines() if "▸" in line)
    assert f"L{first}–{handle} ▸  the pick" in label, label
    for number in (first, handle):  # both lines are marked
        assert re.search(rf"^│ ❱ +{number} ", out, re.MULTILINE), number


def test_guides_10_and_11_label_their_two_line_notes_with_both_lines() -> None:
    assert re.search(r"L1454–1455 ▸  a frozen unit returns here", _shown("10-no-sync-and-frozen-params", 100))
    assert re.search(r"L872–873 ▸  the remaining 2", _shown("11-final-callback-and-hybrid-shard", 100))


# --- diagrams --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("width", WIDTHS)
def test_a_diagram_wider_than_the_console_is_cropped_with_a_marker_never_wrapped(tmp_path: Path, width: int):
    rows = ["construction   strategy → handle strategy" + " " * 40 + "◄── this guide", "forward        (02)"]
    body = "Where we are:\n\n```\n" + "\n".join(rows) + "\n```\n\nAfter.\n"
    out = _render(tmp_path, guide(anchors=PREFETCH_ANCHOR, body=body), width).splitlines()
    first = next(i for i, line in enumerate(out) if "construction" in line)
    assert out[first + 1].strip().startswith("forward"), out[first : first + 2]  # one row each, in order
    shown = out[first].rstrip()
    assert len(shown) <= width
    if len(rows[0]) + 2 > width:
        assert shown.endswith(CROPPED) and rows[0].startswith(shown.strip()[:-1].rstrip())
    else:
        assert shown.strip() == rows[0]


# --- a banner above a definition --------------------------------------------------------------------------------


def test_a_quote_starts_at_the_definition_not_at_a_section_banner_above_it(tmp_path: Path) -> None:
    def add_banner(tree) -> None:
        tree.edit(
            FLAT_PARAM,
            "    def __init__(self, params",
            "    ####\n    # INIT #\n    ####\n    def __init__(self, params",
        )

    anchor = '[[anchors]]\nname = "init"\nsymbol = "torch.distributed.fsdp._flat_param:FlatParamHandle.__init__"\n'
    out = _render(tmp_path, guide(anchors=anchor, body="```source init\n```\n"), edit=add_banner)
    assert "INIT" not in out
    numbered = re.findall(r"^│ (?:❱ |  ) *(\d+) (.*?) *│$", out, re.MULTILINE)
    assert numbered[0][1].strip().startswith("def __init__(self, params")
    assert f"{FLAT_PARAM}:{numbered[0][0]}-{numbered[-1][0]}" in out  # the title cites the lines shown


def test_guide_12s_handle_init_panel_starts_at_def_init() -> None:
    out = _shown("12-flat-parameter", 100)
    title = next(line for line in out.splitlines() if line.startswith("╭─ handle-init"))
    at = out.splitlines().index(title)
    assert "def __init__(" in out.splitlines()[at + 1] and "INITIALIZATION" not in out.splitlines()[at + 1]
