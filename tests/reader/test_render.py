"""`fsdp-readings show`: a guide rendered with its torch source quoted live and notes on the right lines."""

from __future__ import annotations

import io
import itertools
import re
from pathlib import Path

import pytest

from reader.commands.app import main, make_console
from reader.format.parse import parse_guide
from reader.gate.workspace import Workspace
from reader.views.guide import print_guide
from tests.reader.reader_support import LIMIT_ANCHOR, PREFETCH_ANCHOR, TorchTree, guide, make_tree

BODY = """
# Prefetch

Read it.

```source prefetch
note "handle._prefetched = True": marks the handle.
```

```expect order pairs
root -> 1
```
"""
CLAIM = """
[[claims]]
id = "order"
statement = "It prefetches in order."
check = "checks.ranks.selftest:trivial"
world_size = 2
kwargs = { expected = { expect = "order" } }
"""


PLAIN_CLAIM = CLAIM.replace('kwargs = { expected = { expect = "order" } }\n', "")
RUNTIME = "torch/distributed/fsdp/_runtime_utils.py"


def _render(text: str, workspace: Workspace, path: Path, width: int = 140) -> str:
    """The guide as ``show`` prints it (the CLI's console, writing to a buffer that is not a terminal)."""
    buffer = io.StringIO()
    console = make_console(file=buffer, width=width, force_terminal=False, color_system=None)
    print_guide(console, parse_guide(text, path), workspace)
    return buffer.getvalue()


def _line_of(tree: TorchTree, needle: str) -> int:
    return next(i for i, line in enumerate(tree.read(RUNTIME).split("\n"), start=1) if needle in line)


def _numbers(out: str) -> list[int]:
    return [int(m.group(1)) for m in re.finditer(r"^│ (?:❱ |  ) *(\d+) ", out, re.MULTILINE)]


def test_source_block_shows_live_code_with_torch_line_numbers_and_pinned_notes(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "site")
    workspace = Workspace(tree.source(), tmp_path / "anchors.lock")
    text = guide(anchors=PREFETCH_ANCHOR, claims=CLAIM, body=BODY)
    out = _render(text, workspace, tmp_path / "04-forward-prefetch.md")
    code = tree.read("torch/distributed/fsdp/_runtime_utils.py").splitlines()
    line = next(i for i, text_line in enumerate(code, start=1) if "handle._prefetched = True" in text_line)
    assert f"{line} " in out and "handle._prefetched = True" in out  # the live line, numbered as in torch
    assert f"L{line} ▸" in out and "marks the handle." in out  # the note, pinned to that line
    assert "not yet approved" in out  # drift status of the anchor
    assert "expected: order" in out and "checked by claim order" in out
    assert "It prefetches in order." in out

    tree.edit("torch/distributed/fsdp/_runtime_utils.py", "handle._prefetched = True", "handle._prefetched = 1")
    edited = _render(text, Workspace(tree.source(), tmp_path / "anchors.lock"), tmp_path / "04-forward-prefetch.md")
    assert "handle._prefetched = 1" in edited and "not found ▸" in edited  # the note lost its line, visibly


@pytest.mark.shared_index_cache  # the real guides; counts no cache
def test_show_and_list_commands_on_the_real_guides(capsys) -> None:
    readings = Path(__file__).resolve().parents[2] / "readings"
    assert main(["--readings", str(readings), "list"]) == 0
    assert "03-unshard-reshard" in capsys.readouterr().out
    assert main(["--readings", str(readings), "show", "03-unshard-reshard"]) == 0
    out = capsys.readouterr().out
    assert "def _post_forward_reshard(" in out  # quoted live from the installed torch
    assert "the root's storage is kept, not freed" in " ".join(out.split())  # a note pinned to its line
    with pytest.raises(SystemExit) as bare:  # a bare `show` is a usage error: it names the missing GUIDE_ID
        main(["--readings", str(readings), "show"])
    assert bare.value.code == 2
    assert "the following arguments are required: GUIDE_ID" in capsys.readouterr().err


def test_a_region_of_a_kind_the_renderer_does_not_know_is_shown_as_written(tmp_path: Path, quiz_parser: str):
    tree = make_tree(tmp_path / "site")
    workspace = Workspace(tree.source(), tmp_path / "anchors.lock")
    body = BODY + "\n```quiz What marks the handle?\nhandle._prefetched\n```\n\nAfter the quiz.\n"
    text = guide(anchors=PREFETCH_ANCHOR, claims=CLAIM, body=body)
    out = _render(text, workspace, tmp_path / "04-forward-prefetch.md")
    assert "```quiz What marks the handle?\nhandle._prefetched\n```" in out and "After the quiz." in out
    assert "It prefetches in order." in out  # the claims table still follows


def test_a_quote_shows_exactly_the_anchor_lines_under_a_path_relative_to_site_packages(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "site")
    workspace = Workspace(tree.source(), tmp_path / "anchors.lock")
    body = "```source limit\n```\n\n```source prefetch\n```\n"
    out = _render(guide(anchors=LIMIT_ANCHOR + PREFETCH_ANCHOR, body=body), workspace, tmp_path / "g.md", 100)
    limit = _line_of(tree, "_PREFETCH_LIMIT: int = 2")
    first, last = _line_of(tree, "# Prefetch is issued"), _line_of(tree, "handle._prefetched = True")
    assert _numbers(out) == [limit, *range(first, last + 1)]  # no blank line numbered one past either end
    assert f"╭─ limit · {RUNTIME}:{limit}-{limit} ─" in out and str(tree.root) not in out
    assert f"╭─ prefetch · {RUNTIME}:{first}-{last} ─" in out
    assert "_PREFETCH_LIMIT · not yet approved" in out and "_prefetch_handle · not yet approved" in out


def test_notes_are_shown_in_line_order_right_under_the_lines_they_pin(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "site")
    workspace = Workspace(tree.source(), tmp_path / "anchors.lock")
    body = """
```source prefetch
note "handle._prefetched = True": fourth, written first.
note "if not current_handle:": first.
note "prev_training_state = handle._training_state": third.
note "handle = _get_handle_to_prefetch(state, current_handle)": second.
note "no_such_call()": lost.
```
"""
    out = _render(guide(anchors=PREFETCH_ANCHOR, body=body), workspace, tmp_path / "g.md", 100).splitlines()
    notes = [line for line in out if "▸" in line]
    assert [n.split("▸")[1].split()[0] for n in notes] == ["first.", "second.", "third.", "fourth,", "lost."]
    for needle, text in [("if not current_handle:", "first."), ("handle._prefetched = True", "fourth,")]:
        line = _line_of(tree, needle)
        at = next(i for i, row in enumerate(out) if f"L{line} ▸  {text}" in row)
        assert re.match(rf"│ ❱ +{line} ", out[at - 1]), out[at - 1]  # directly under its (marked) line
    assert "not found ▸  lost." in notes[-1]


def test_long_code_lines_continue_on_marked_rows_past_their_indentation(tmp_path: Path) -> None:
    """A quoted line too wide for the panel continues on rows marked ``↪`` in the number column, indented past
    the line's own indentation. They once continued under a blank number at the panel's left edge, where a
    continuation read as a line of its own with no number, dedented out of its block."""
    tree = make_tree(tmp_path / "site")
    long_call = "_unshard(state, handle, state._unshard_stream, state._pre_unshard_stream)"
    tree.edit(RUNTIME, long_call, long_call.replace(")", ", " + ", ".join(f"extra_{i}" for i in range(12)) + ")"))
    workspace = Workspace(tree.source(), tmp_path / "anchors.lock")
    out = _render(guide(anchors=PREFETCH_ANCHOR, body="```source prefetch\n```\n"), workspace, tmp_path / "g.md", 60)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 60
    at = next(i for i, line in enumerate(lines) if "_unshard(state, handle," in line)
    numbered = re.match(r"│ (?:❱ |  )( *\d+) ( *)_unshard", lines[at])
    assert numbered is not None
    continued = list(itertools.takewhile(lambda line: "↪" in line, lines[at + 1 :]))
    assert continued, lines[at : at + 3]
    for row in continued:  # the marker where the number would be, the code past the line's indentation
        marked = re.match(r"│   ( *)↪ ( *)\S", row)
        assert marked is not None and len(marked.group(1)) + 1 == len(numbered.group(1)), row
        assert len(marked.group(2)) == len(numbered.group(2)) + 4, row
    shown = " ".join([lines[at], *continued])
    assert all(f"extra_{i}," in shown for i in range(11)) and "extra_11)" in shown  # wrapped, not cropped
    assert "extra_11)" not in lines[at]
    assert _numbers(out) == list(range(_line_of(tree, "# Prefetch is"), _line_of(tree, "handle._prefetched") + 1))


def test_prose_wraps_at_word_boundaries_and_claims_get_the_width(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "site")
    workspace = Workspace(tree.source(), tmp_path / "anchors.lock")
    words = [f"word{i:03d}" for i in range(75)]  # a 600-character paragraph
    items = "\n".join(f"- item {i}: " + " ".join(words[:20]) for i in range(2))
    body = " ".join(words) + "\n\n" + items + "\n"
    out = _render(guide(anchors=PREFETCH_ANCHOR, claims=PLAIN_CLAIM, body=body), workspace, tmp_path / "g.md", 80)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    shown = out.split()
    assert [w for w in shown if w.startswith("word")] == words + words[:20] * 2  # every word, whole, in order
    statement = next(line for line in lines if "It prefetches in order." in line)
    assert statement.strip() == "It prefetches in order."  # a line of its own, not a narrow column
    assert any(line.strip() == "check checks.ranks.selftest:trivial" for line in lines)


def test_the_cli_console_prints_show_wrapped_without_escape_codes(tmp_path: Path, installed_tree, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "70")
    (tmp_path / "readings").mkdir()
    paragraph = " ".join(f"w{i}" for i in range(200))
    (tmp_path / "readings" / "04-forward-prefetch.md").write_text(
        guide(anchors=PREFETCH_ANCHOR, claims=PLAIN_CLAIM, body=paragraph + "\n\n```source prefetch\n```\n")
    )
    assert main(["show", "04-forward-prefetch"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert max(len(line) for line in out.splitlines()) <= 70
    assert [w for w in out.split() if re.fullmatch(r"w\d+", w)] == paragraph.split()
