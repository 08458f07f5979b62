"""Every drift class, end to end through the workspace: approve on one synthetic torch, edit it, compare."""

from __future__ import annotations

from pathlib import Path

import pytest

from reader.format.guide import Guide
from reader.format.parse import parse_guide
from reader.gate.approval import NotApprovable
from reader.gate.drift import DriftKind
from reader.gate.lock import Lock
from reader.gate.workspace import Workspace
from reader.source.index import IndexCache
from tests.reader.reader_support import LIMIT_ANCHOR, PREFETCH_ANCHOR, UNSHARD_ANCHOR, TorchTree, guide

RUNTIME = "torch/distributed/fsdp/_runtime_utils.py"
NARROWED = """
[[anchors]]
name = "mark"
symbol = "torch.distributed.fsdp._runtime_utils:_prefetch_handle"
pattern = "handle._prefetched = True"
"""
BODY = """
# Prefetch

```source prefetch
note "_unshard(state, handle": issues the all-gather.
```
"""


def load(text: str, tmp_path: Path) -> Guide:
    return parse_guide(text, tmp_path / "readings" / "04-forward-prefetch.md")


def approved_workspace(tree: TorchTree, tmp_path: Path, g: Guide) -> Path:
    workspace = Workspace(tree.source(), tmp_path / "readings" / "anchors.lock", IndexCache())
    workspace.approve_guide(g, {})  # these guides have no claims
    assert workspace.save()
    return workspace.lock_path


def drift_after(tree: TorchTree, tmp_path: Path, edit, anchors: str = PREFETCH_ANCHOR, body: str = ""):
    g = load(guide(anchors=anchors, body=body), tmp_path)
    lock_path = approved_workspace(tree, tmp_path, g)
    edit(tree)
    workspace = Workspace(tree.source(), lock_path, IndexCache())
    return [workspace.drift(g, a) for a in g.anchors]


def test_unchanged(torch_tree: TorchTree, tmp_path: Path):
    (drift,) = drift_after(torch_tree, tmp_path, lambda t: None)
    assert drift.kind is DriftKind.UNCHANGED and drift.ok and not drift.diff


def test_moved(torch_tree: TorchTree, tmp_path: Path):
    (drift,) = drift_after(
        torch_tree,
        tmp_path,
        lambda t: t.edit(RUNTIME, "class _PrefetchMode", "X = 1\n\n\nclass _PrefetchMode"),
    )
    assert drift.kind is DriftKind.MOVED and drift.ok
    assert drift.current is not None and (drift.current.start, drift.current.end) == (20, 32)
    assert drift.approved is not None and drift.approved.lines == (17, 29)


@pytest.mark.parametrize(
    "old,new",
    [
        ("# Prefetch is issued from the hooks, never from user code.", "# Reworded comment."),
        ('"""Prefetch the next handle if needed (without synchronization)."""', '"""New docs."""'),
        (
            "    if not current_handle:\n        return\n",
            "    if not current_handle:  # early out\n\n        return\n",
        ),
        (
            "_unshard(state, handle, state._unshard_stream, state._pre_unshard_stream)",
            "_unshard(\n        state,\n        handle,\n"
            "        state._unshard_stream,\n        state._pre_unshard_stream,\n    )",
        ),
    ],
    ids=["comment", "docstring", "blank-lines", "reformatted"],
)
def test_cosmetic(torch_tree: TorchTree, tmp_path: Path, old: str, new: str):
    (drift,) = drift_after(torch_tree, tmp_path, lambda t: t.edit(RUNTIME, old, new))
    assert drift.kind is DriftKind.COSMETIC and drift.ok
    assert drift.diff  # shown on request, but passing


def test_annotations_only(torch_tree: TorchTree, tmp_path: Path):
    (drift,) = drift_after(
        torch_tree, tmp_path, lambda t: t.edit(RUNTIME, "Optional[FlatParamHandle]", "FlatParamHandle | None")
    )
    assert drift.kind is DriftKind.ANNOTATIONS and not drift.ok


def test_code_changed_diff_points_at_real_lines(torch_tree: TorchTree, tmp_path: Path):
    (drift,) = drift_after(
        torch_tree,
        tmp_path,
        lambda t: t.edit(RUNTIME, "handle._prefetched = True", "handle._prefetched = bool(handle)"),
    )
    assert drift.kind is DriftKind.CODE and not drift.ok
    assert "-    handle._prefetched = True\n+    handle._prefetched = bool(handle)\n" in drift.diff
    assert "@@ -26,4 +26,4 @@" in drift.diff  # torch's own line numbers, not 1-based snippet offsets
    assert drift.diff.startswith(f"--- approved {RUNTIME}:17-29 (torch 2.13.0)\n+++ current  {RUNTIME}:17-29")


def test_signature_changed(torch_tree: TorchTree, tmp_path: Path):
    (drift,) = drift_after(
        torch_tree,
        tmp_path,
        lambda t: t.edit(RUNTIME, 'prefetch_mode: "_PrefetchMode")', "prefetch_mode, limit=2)"),
    )
    assert drift.kind is DriftKind.SIGNATURE


def test_removed_suggests_the_nearest_name(torch_tree: TorchTree, tmp_path: Path):
    (drift,) = drift_after(
        torch_tree, tmp_path, lambda t: t.edit(RUNTIME, "def _prefetch_handle(", "def _prefetch_handles(")
    )
    assert drift.kind is DriftKind.REMOVED and drift.error is not None
    assert any("`_prefetch_handles` (line 18)" in hint for hint in drift.error.hints)


def test_removed_because_moved_to_another_module(torch_tree: TorchTree, tmp_path: Path):
    def move(tree: TorchTree) -> None:
        text = tree.read(RUNTIME)
        start, end = text.index("# Prefetch is issued"), text.index("def _get_handle_to_prefetch")
        tree.write("torch/distributed/fsdp/_prefetch.py", text[start:end])
        tree.write(
            RUNTIME,
            text[:start] + "from torch.distributed.fsdp._prefetch import _prefetch_handle\n\n\n" + text[end:],
        )

    (drift,) = drift_after(torch_tree, tmp_path, move)
    assert drift.kind is DriftKind.REMOVED and drift.error is not None
    hints = "\n".join(drift.error.hints)
    assert "now imported into torch.distributed.fsdp._runtime_utils from torch.distributed.fsdp._prefetch" in hints
    assert "`torch.distributed.fsdp._prefetch:_prefetch_handle`" in hints


def test_removed_module_suggests_modules(torch_tree: TorchTree, tmp_path: Path):
    def rename(tree: TorchTree) -> None:
        tree.path(RUNTIME).rename(tree.path("torch/distributed/fsdp/_runtime_util.py"))

    (drift,) = drift_after(torch_tree, tmp_path, rename)
    assert drift.kind is DriftKind.REMOVED and drift.error is not None
    assert "does not exist" in drift.error.message
    assert any("torch.distributed.fsdp._runtime_util" in h for h in drift.error.hints)


def test_pattern_lost_and_narrowing(torch_tree: TorchTree, tmp_path: Path):
    g = load(guide(anchors=NARROWED), tmp_path)
    workspace = Workspace(torch_tree.source(), tmp_path / "l.lock", IndexCache())
    resolved = workspace.resolver.resolve(g.anchors[0].symbol, g.anchors[0].pattern)
    assert (resolved.start, resolved.end, resolved.text) == (29, 29, "    handle._prefetched = True\n")
    assert resolved.definition == (17, 29) and resolved.kind == "function"
    (drift,) = drift_after(
        torch_tree,
        tmp_path,
        lambda t: t.edit(RUNTIME, "handle._prefetched = True", "handle.prefetched = True"),
        anchors=NARROWED,
    )
    assert drift.kind is DriftKind.PATTERN_LOST
    assert "matches nothing" in drift.summary


def test_narrowed_anchor_ignores_edits_elsewhere_in_the_function(torch_tree: TorchTree, tmp_path: Path):
    (drift,) = drift_after(
        torch_tree,
        tmp_path,
        lambda t: t.edit(RUNTIME, "if not handle:\n        return", "if handle is None:\n        return"),
        anchors=NARROWED,
    )
    assert drift.kind is DriftKind.MOVED or drift.kind is DriftKind.UNCHANGED


def test_ambiguous_definitions_need_a_pattern(torch_tree: TorchTree, tmp_path: Path):
    anchors = '[[anchors]]\nname = "sharded"\nsymbol = "torch.distributed.fsdp._flat_param:FlatParamHandle.sharded"\n'
    g = load(guide(anchors=anchors), tmp_path)
    workspace = Workspace(torch_tree.source(), tmp_path / "l.lock", IndexCache())
    drift = workspace.drift(g, g.anchors[0])
    assert drift.kind is DriftKind.PATTERN_LOST and "defined 2 times (lines 22, 26)" in drift.summary
    picked = load(guide(anchors=anchors + 'pattern = "self._sharded = value"\n'), tmp_path)
    resolved = workspace.resolver.resolve(picked.anchors[0].symbol, picked.anchors[0].pattern)
    assert resolved.definition == (26, 28)


def test_not_yet_approved_and_anchor_edited_since_approval(torch_tree: TorchTree, tmp_path: Path):
    g = load(guide(anchors=PREFETCH_ANCHOR), tmp_path)
    workspace = Workspace(torch_tree.source(), tmp_path / "readings" / "anchors.lock", IndexCache())
    assert workspace.drift(g, g.anchors[0]).kind is DriftKind.UNAPPROVED
    approved_workspace(torch_tree, tmp_path, g)
    edited = load(guide(anchors=PREFETCH_ANCHOR.replace("_prefetch_handle", "_get_handle_to_prefetch")), tmp_path)
    workspace = Workspace(torch_tree.source(), tmp_path / "readings" / "anchors.lock", IndexCache())
    drift = workspace.drift(edited, edited.anchors[0])
    assert drift.kind is DriftKind.UNAPPROVED and "changed since approval" in drift.summary
    assert drift.diff  # what the person now has to read, against what they read before


def test_notes_survive_rewrapping(torch_tree: TorchTree, tmp_path: Path):
    (drift,) = drift_after(
        torch_tree,
        tmp_path,
        lambda t: t.edit(
            RUNTIME,
            "_unshard(state, handle, state._unshard_stream",
            "# reworded\n    _unshard(\n        state, handle, state._unshard_stream",
        ),
        body=BODY,
    )
    assert drift.kind is DriftKind.COSMETIC and not drift.problems


def test_notes_that_lose_their_code_fail_the_anchor(torch_tree: TorchTree, tmp_path: Path):
    (drift,) = drift_after(
        torch_tree,
        tmp_path,
        lambda t: t.edit(RUNTIME, "    _unshard(state, handle,", "    _unshard(handle, state,"),
        body=BODY,
    )
    assert drift.kind is DriftKind.CODE  # the code changed, and on top of that a note lost its place
    assert "04-forward-prefetch.md:15: note pattern `_unshard(state, handle`" in drift.problems[0]
    assert "matches nowhere" in drift.problems[0]


def test_a_note_edited_to_match_nothing_fails_an_unchanged_anchor(torch_tree: TorchTree, tmp_path: Path):
    g = load(guide(anchors=PREFETCH_ANCHOR, body=BODY), tmp_path)
    lock_path = approved_workspace(torch_tree, tmp_path, g)
    ambiguous = load(guide(anchors=PREFETCH_ANCHOR, body=BODY.replace("_unshard(state, handle", "state")), tmp_path)
    drift = Workspace(torch_tree.source(), lock_path, IndexCache()).drift(ambiguous, ambiguous.anchors[0])
    assert drift.kind is DriftKind.PATTERN_LOST
    assert "note pattern `state` matches 5 times" in drift.problems[0]


def test_assignments_and_methods_resolve(torch_tree: TorchTree, tmp_path: Path):
    drifts = drift_after(
        torch_tree,
        tmp_path,
        lambda t: t.edit(RUNTIME, "_PREFETCH_LIMIT: int = 2", "_PREFETCH_LIMIT = 2"),
        anchors=LIMIT_ANCHOR + UNSHARD_ANCHOR,
    )
    assert [d.kind for d in drifts] == [DriftKind.ANNOTATIONS, DriftKind.UNCHANGED]
    assert drifts[0].current is not None and drifts[0].current.kind == "assignment"


def test_approve_refuses_what_cannot_be_pinned(torch_tree: TorchTree, tmp_path: Path):
    g = load(guide(anchors=NARROWED), tmp_path)
    lock_path = approved_workspace(torch_tree, tmp_path, g)
    torch_tree.edit(RUNTIME, "handle._prefetched = True", "handle.done = True")
    workspace = Workspace(torch_tree.source(), lock_path, IndexCache())
    with pytest.raises(NotApprovable, match="pattern lost"):
        workspace.approve_guide(g, {})


def test_approving_unchanged_source_on_a_new_release_changes_no_entry(torch_tree: TorchTree, tmp_path: Path):
    g = load(guide(anchors=NARROWED), tmp_path)
    lock_path = approved_workspace(torch_tree, tmp_path, g)
    torch_tree.set_version("2.14.0+cu130")
    workspace = Workspace(torch_tree.source(), lock_path, IndexCache())
    (approval,) = workspace.approve_guide(g, {}).anchors
    assert approval.drift.kind is DriftKind.UNCHANGED
    assert approval.source.approved_on == ("2.13.0",)  # it holds from 2.13.0 on; the guide's record says 2.14.0
    workspace.save()
    lock = Lock.load(lock_path)
    assert lock.releases_of(g.id) == ("2.14.0",)  # no matrix: the newest release replaces the older
    torch_tree.edit(RUNTIME, "handle._prefetched = True", "handle._prefetched = True  # now commented")
    torch_tree.set_version("2.15.0")
    workspace = Workspace(torch_tree.source(), lock_path, IndexCache())
    assert workspace.approve_guide(g, {}).anchors[0].source.approved_on == ("2.15.0",)  # new text
    workspace.save()
    entry = Lock.load(lock_path).get(g.id, "mark")
    assert entry is not None and [s.source for s in entry.sources] == [
        "    handle._prefetched = True  # now commented\n"
    ]


def test_prune_drops_entries_the_guide_no_longer_declares(torch_tree: TorchTree, tmp_path: Path):
    g = load(guide(anchors=PREFETCH_ANCHOR + UNSHARD_ANCHOR), tmp_path)
    lock_path = approved_workspace(torch_tree, tmp_path, g)
    fewer = load(guide(anchors=PREFETCH_ANCHOR), tmp_path)
    workspace = Workspace(torch_tree.source(), lock_path, IndexCache())
    assert workspace.prune(fewer) == ["04-forward-prefetch/unshard"]
