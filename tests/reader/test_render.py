"""`fsdp-readings show`: a guide rendered with its torch source quoted live and notes on the right lines."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from reader.cli import main
from reader.parse import parse_guide
from reader.render import render_guide
from reader.workspace import Workspace
from tests.reader.reader_support import PREFETCH_ANCHOR, guide, make_tree

BODY = """
# Prefetch

Read it.

```source prefetch
note "handle._prefetched = True": marks the handle.
```

```expect order
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


def _render(text: str, workspace: Workspace, path: Path) -> str:
    console = Console(record=True, width=140, color_system=None)
    for part in render_guide(parse_guide(text, path), workspace):
        console.print(part)
    return console.export_text()


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


def test_show_and_list_commands_on_the_real_guides(capsys) -> None:
    readings = Path(__file__).resolve().parents[2] / "readings"
    assert main(["--readings", str(readings), "list"]) == 0
    assert "03-unshard-reshard" in capsys.readouterr().out
    assert main(["--readings", str(readings), "show", "03-unshard-reshard"]) == 0
    out = capsys.readouterr().out
    assert "def _post_forward_reshard(" in out  # quoted live from the installed torch
    assert "the root is kept unsharded" in out
    assert main(["--readings", str(readings), "show"]) == 2


def test_a_region_of_a_kind_the_renderer_does_not_know_is_shown_as_written(tmp_path: Path, quiz_parser: str):
    tree = make_tree(tmp_path / "site")
    workspace = Workspace(tree.source(), tmp_path / "anchors.lock")
    body = BODY + "\n```quiz What marks the handle?\nhandle._prefetched\n```\n\nAfter the quiz.\n"
    text = guide(anchors=PREFETCH_ANCHOR, claims=CLAIM, body=body)
    out = _render(text, workspace, tmp_path / "04-forward-prefetch.md")
    assert "```quiz What marks the handle?\nhandle._prefetched\n```" in out and "After the quiz." in out
    assert "It prefetches in order." in out  # the claims table still follows
