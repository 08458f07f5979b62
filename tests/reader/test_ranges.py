"""Torch ranges on guide content: an anchor (``torch = "<2.15"``), a source block (```source a [torch <2.15]), a
note (``note "…" [torch >=2.15]:``) and an expect block (```expect order pairs [torch >=2.15]) hold only for the
releases they name. Elsewhere they are not read: not resolved, compared, shown, checked or approved."""

from __future__ import annotations

from pathlib import Path

import pytest

from reader.format.errors import GuideError
from reader.format.guide import ExpectBlock, ExpectBlockUnavailable, SourceBlock
from reader.format.parse import parse_guide
from reader.gate.drift import DriftKind
from reader.gate.workspace import Workspace
from reader.source.index import IndexCache
from tests.reader.reader_support import PREFETCH_ANCHOR, TorchTree, guide

RUNTIME = "torch/distributed/fsdp/_runtime_utils.py"
HOOKS = """
[[anchors]]
name = "hooks"
symbol = "torch.distributed.fsdp._runtime_utils:_register_pre_backward_hooks"
torch = "<2.15"
"""
CLAIM = """
[[claims]]
id = "order"
statement = "Prefetch follows the recorded order."
check = "fakechecks.prefetch:forward_order"
world_size = 2
kwargs = { expected = { expect = "order" } }
"""
BODY = """
# Prefetch

```source prefetch [torch <2.15]
note "handle._prefetched = True": marks the handle.
```

```source prefetch [torch >=2.15]
note "handle._prefetched = True" [torch >=2.16]: still marks it.
```

```source hooks
note "return [_register_hook(o) for o in outputs]": one hook per output.
```

```expect order pairs [torch <2.15]
root -> blocks.0
```

```expect order pairs [torch >=2.15]
root -> blocks.1
```
"""


def parse(text: str):
    return parse_guide(text, Path("readings/04-forward-prefetch.md"))


def problems(text: str) -> list[tuple[int, str, str]]:
    with pytest.raises(GuideError) as info:
        parse(text)
    return [(p.line, p.message, p.fix) for p in info.value.problems]


def test_ranges_are_read_from_tables_and_fences():
    g = parse(guide(anchors=PREFETCH_ANCHOR + HOOKS, claims=CLAIM, body=BODY))
    hooks = g.anchor("hooks")
    assert str(hooks.torch) == "<2.15" and hooks.applies_to("2.13.0+cpu") and not hooks.applies_to("2.15.0+cu132")
    first, second, _ = g.regions_of(SourceBlock)
    assert str(first.torch) == "<2.15" and str(second.torch) == ">=2.15"
    assert [str(b.torch) for b in g.regions_of(ExpectBlock)] == ["<2.15", ">=2.15"]


def test_a_guide_read_on_one_release_leaves_out_what_holds_elsewhere():
    g = parse(guide(anchors=PREFETCH_ANCHOR + HOOKS, claims=CLAIM, body=BODY))
    (claim,) = g.claims
    old, new, newer = g.on("2.13.0+cpu"), g.on("2.15.0"), g.on("2.16.0")
    assert [a.name for a in old.anchors] == ["prefetch", "hooks"] and [a.name for a in new.anchors] == ["prefetch"]
    assert [(b.anchor, len(b.notes)) for b in old.source_blocks()] == [("prefetch", 1), ("hooks", 1)]
    assert [(b.anchor, len(b.notes)) for b in new.source_blocks()] == [("prefetch", 0)]  # its note is for 2.16
    assert [(b.anchor, len(b.notes)) for b in newer.source_blocks()] == [("prefetch", 1)]
    assert old.claim_kwargs(claim)["expected"].pairs == [("root", "blocks.0")]
    assert new.claim_kwargs(claim)["expected"].pairs == [("root", "blocks.1")]
    assert new.claims == g.claims  # claims stay: each is skipped by its own `torch`
    with pytest.raises(ExpectBlockUnavailable, match="read on no torch in particular both apply"):
        g.claim_kwargs(claim)  # the guide read on no release in particular cannot pick one


def test_a_claim_whose_expect_block_has_no_version_for_this_torch_says_what_to_do():
    body = BODY.replace("```expect order pairs [torch >=2.15]\nroot -> blocks.1\n```\n", "")
    g = parse(guide(anchors=PREFETCH_ANCHOR, claims=CLAIM, body=body.replace("```source hooks", "```source prefetch")))
    with pytest.raises(ExpectBlockUnavailable, match=r"has no version for torch 2\.15\.0: scope the claim"):
        g.on("2.15.0").claim_kwargs(g.claims[0])


@pytest.mark.parametrize(
    "old,new,message",
    [
        ('torch = "<2.15"', 'torch = "before 2.15"', '`torch = "before 2.15"` is not a PEP 440 version specifier'),
        ("```source prefetch [torch <2.15]", "```source prefetch [torch soon]", "`[torch soon]` is not a PEP 440"),
        ("```source hooks", "```source hooks extra", "a source block names one anchor, got `source hooks extra`"),
        ("```expect order pairs [torch >=2.15]", "```expect order pairs", "duplicate expect block `order`"),
        ("```expect order pairs [torch <2.15]", "```expect order pairs [torch <]", "`[torch <]` is not a PEP 440"),
    ],
)
def test_bad_ranges_name_their_line(old: str, new: str, message: str):
    text = guide(anchors=PREFETCH_ANCHOR + HOOKS, body=BODY).replace(old, new)
    lines = text.split("\n")
    line = lines.index(new) + 1
    ((at, said, _),) = problems(text)  # one problem each: a bad range does not cascade
    assert (at, message in said) == (line, True), said


def test_a_claim_proven_only_by_scoped_anchors_must_be_scoped_too():
    claim = CLAIM.replace('kwargs = { expected = { expect = "order" } }', 'evidence = ["hooks"]')
    text = guide(anchors=PREFETCH_ANCHOR + HOOKS, claims=claim)
    ((line, message, fix),) = problems(text)
    assert line == text.split("\n").index('evidence = ["hooks"]') + 1
    assert "every evidence anchor of this claim is scoped to some torch releases (hooks)" in message
    assert fix.startswith('give the claim the same range (`torch = "<2.15"`)')
    scoped = claim.replace("world_size = 2", 'world_size = 2\ntorch = "<2.15"')
    assert parse(guide(anchors=PREFETCH_ANCHOR + HOOKS, claims=scoped)).claims[0].evidence == ("hooks",)


def test_an_anchor_for_other_releases_is_not_resolved_or_compared(torch_tree: TorchTree, tmp_path: Path):
    g = parse(guide(anchors=PREFETCH_ANCHOR + HOOKS, body=BODY))
    text = torch_tree.read(RUNTIME)
    torch_tree.write(RUNTIME, text[: text.index("def _register_pre_backward_hooks")])  # removed in "2.15"
    torch_tree.set_version("2.15.0")
    workspace = Workspace(torch_tree.source(), tmp_path / "anchors.lock", IndexCache())
    resolved, failed = workspace.resolutions(g)
    assert list(resolved) == ["prefetch"] and failed == {}
    found = workspace.drift(g, g.anchor("hooks"))
    assert found.kind is DriftKind.OTHER_TORCH and found.ok
    assert found.summary == "reads torch <2.15; this torch is 2.15.0"
    assert workspace.drift(g, g.anchor("prefetch")).problems == []  # the 2.16 note is not checked on 2.15


def test_show_quotes_only_what_holds_on_this_torch(torch_tree: TorchTree, tmp_path: Path, monkeypatch, capsys):
    from reader.commands.app import main
    from reader.source import torch_source

    monkeypatch.chdir(tmp_path)
    (tmp_path / "readings").mkdir()
    (tmp_path / "readings" / "04-forward-prefetch.md").write_text(guide(anchors=PREFETCH_ANCHOR + HOOKS, body=BODY))
    monkeypatch.setattr(torch_source, "installed_root", lambda: torch_tree.root)
    assert main(["show", "04-forward-prefetch"]) == 0
    shown = capsys.readouterr().out
    assert "one hook per output" in shown and "root -> blocks.0" in shown and "root -> blocks.1" not in shown
    text = torch_tree.read(RUNTIME)
    torch_tree.write(RUNTIME, text[: text.index("def _register_pre_backward_hooks")])
    torch_tree.set_version("2.15.0")
    assert main(["show", "04-forward-prefetch"]) == 0
    shown = capsys.readouterr().out
    assert "one hook per output" not in shown and "has no `_register_pre_backward_hooks`" not in shown  # not read
    assert "root -> blocks.1" in shown and "root -> blocks.0" not in shown


def test_drift_skips_an_anchor_for_other_releases(torch_tree: TorchTree, tmp_path: Path, monkeypatch, capsys):
    import json

    from reader.commands.app import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "readings").mkdir()
    (tmp_path / "readings" / "04-forward-prefetch.md").write_text(guide(anchors=PREFETCH_ANCHOR + HOOKS))
    text = torch_tree.read(RUNTIME)
    torch_tree.write(RUNTIME, text[: text.index("def _register_pre_backward_hooks")])
    torch_tree.set_version("2.15.0")
    assert main(["drift", "--torch-source", str(torch_tree.root), "--report", "r.json"]) == 6  # prefetch: unapproved
    (report,) = json.loads(Path("r.json").read_text())["guides"]
    hooks = next(a for a in report["anchors"] if a["name"] == "hooks")
    assert (hooks["outcome"], hooks["message"]) == ("skipped", "reads torch <2.15; this torch is 2.15.0")
    assert "has no `_register_pre_backward_hooks`" not in capsys.readouterr().out
