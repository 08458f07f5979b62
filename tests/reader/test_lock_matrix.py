"""A lock approved on a matrix of torch releases, made clean on every leg with the commands alone.

Two synthetic torch trees with real differences: 2.15.0 adds a line to `_prefetch_handle` (a code change),
rewords its docstring (a narrowing pattern that no longer lands: a moved pattern) and removes
`_register_pre_backward_hooks` (a removed symbol). The guide gives the removed and moved code torch ranges, and
each leg is approved on its own installed torch with `fsdp-readings approve`, as a team keeping both legs green
would (`--matrix 2.13,2.15` on the first).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest

from reader.format.guide import Guide
from reader.format.parse import parse_guide
from reader.gate.drift import Drift, DriftKind
from reader.gate.lock import Lock, LockError
from reader.gate.workspace import Workspace
from reader.source import torch_source
from reader.source.index import IndexCache
from tests.reader.reader_support import PREFETCH_ANCHOR, UNSHARD_ANCHOR, TorchTree, cli, guide, make_tree

RUNTIME = "torch/distributed/fsdp/_runtime_utils.py"
OLD_LINE = "    handle._prefetched = True"
NEW_LINE = "    handle._prefetched = True\n    handle._prefetch_count = 1"
OLD_DOC = '"""Prefetch the next handle if needed (without synchronization)."""'
NEW_DOC = '"""Prefetches the next handle if needed (without synchronization)."""'
GUIDE_ID = "04-forward-prefetch"
RANGED = f"""
[[anchors]]
name = "doc"
symbol = "torch.distributed.fsdp._runtime_utils:_prefetch_handle"
pattern = '{OLD_DOC}'
torch = "<2.15"

[[anchors]]
name = "doc-2.15"
symbol = "torch.distributed.fsdp._runtime_utils:_prefetch_handle"
pattern = '{NEW_DOC}'
torch = ">=2.15"

[[anchors]]
name = "hooks"
symbol = "torch.distributed.fsdp._runtime_utils:_register_pre_backward_hooks"
torch = "<2.15"
"""
BODY = """
# Prefetch

```source prefetch
note "handle._prefetched = True": the mark that stops a second prefetch.
note "handle._prefetch_count = 1" [torch >=2.15]: 2.15 also counts prefetches.
```

```source hooks
note "return [_register_hook(o) for o in outputs]": one hook per output.
```
"""


def tree(root: Path, version: str, *, new: bool = False, code: str = OLD_LINE) -> TorchTree:
    made = make_tree(root)
    made.set_version(version)
    if new:
        made.edit(RUNTIME, OLD_LINE, NEW_LINE)
        made.edit(RUNTIME, OLD_DOC, NEW_DOC)
        text = made.read(RUNTIME)
        made.write(RUNTIME, text[: text.index("def _register_pre_backward_hooks")])
    elif code != OLD_LINE:
        made.edit(RUNTIME, OLD_LINE, code)
    return made


@pytest.fixture
def readings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    directory = tmp_path / "readings"
    directory.mkdir()
    (directory / f"{GUIDE_ID}.md").write_text(guide(anchors=PREFETCH_ANCHOR + UNSHARD_ANCHOR + RANGED, body=BODY))
    return directory


@pytest.fixture
def legs(tmp_path: Path) -> dict[str, TorchTree]:
    return {"2.13": tree(tmp_path / "t213", "2.13.0+cpu"), "2.15": tree(tmp_path / "t215", "2.15.0+cu132", new=True)}


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch):
    """Make a tree the installed torch, as a leg's venv would have it."""

    def installing(leg: TorchTree) -> TorchTree:
        monkeypatch.setattr(torch_source, "installed_root", lambda: leg.root)
        return leg

    return installing


def approve(*argv: str) -> int:
    return cli(["approve", *argv])


def the_guide(readings: Path) -> Guide:
    return parse_guide((readings / f"{GUIDE_ID}.md").read_text(), readings / f"{GUIDE_ID}.md")


def drift(readings: Path, tree_: TorchTree, anchor: str = "prefetch") -> Drift:
    g = the_guide(readings)
    workspace = Workspace(tree_.source(), readings / "anchors.lock", IndexCache())
    return workspace.drift(g, g.anchor(anchor))


def all_drifts(readings: Path, tree_: TorchTree) -> dict[str, DriftKind]:
    g = the_guide(readings)
    workspace = Workspace(tree_.source(), readings / "anchors.lock", IndexCache())
    return {a.name: workspace.drift(g, a).kind for a in g.anchors}


def test_both_legs_are_clean_once_each_is_approved_on_its_own_torch(readings, legs, install):
    install(legs["2.13"])
    assert approve("--matrix", "2.13,2.15", GUIDE_ID) == 0
    assert all_drifts(readings, legs["2.15"]) == {
        "prefetch": DriftKind.CODE,  # 2.15's code not yet read
        "unshard": DriftKind.UNCHANGED,
        "doc": DriftKind.OTHER_TORCH,  # the moved pattern: read through `doc-2.15` there
        "doc-2.15": DriftKind.UNAPPROVED,
        "hooks": DriftKind.OTHER_TORCH,  # the removed symbol: read only where it exists
    }
    install(legs["2.15"])
    assert approve(GUIDE_ID) == 0  # the matrix is stored in the lock: no flag needed again
    lock = Lock.load(readings / "anchors.lock")
    assert lock.matrix == ("2.13.0", "2.15.0")  # releases, without build tags
    assert lock.releases_of(GUIDE_ID) == ("2.13.0", "2.15.0")
    entry = lock.get(GUIDE_ID, "prefetch")
    assert entry is not None and [s.approved_on for s in entry.sources] == [("2.13.0",), ("2.15.0",)]
    assert "_prefetch_count" in entry.sources[1].source and "_prefetch_count" not in entry.sources[0].source
    for name in ("unshard", "hooks", "doc"):  # untouched by 2.15's approval
        kept = lock.get(GUIDE_ID, name)
        assert kept is not None and [s.approved_on for s in kept.sources] == [("2.13.0",)]
    for leg in legs.values():
        assert all(kind.ok for kind in all_drifts(readings, leg).values()), all_drifts(readings, leg)
    # Re-approving an unchanged leg is a no-op: the other leg's sources stay.
    before = (readings / "anchors.lock").read_text()
    install(legs["2.13"])
    assert approve(GUIDE_ID) == 0 and (readings / "anchors.lock").read_text() == before


UNSCOPED = f"""
[[anchors]]
name = "doc"
symbol = "torch.distributed.fsdp._runtime_utils:_prefetch_handle"
pattern = '{OLD_DOC}'

[[anchors]]
name = "hooks"
symbol = "torch.distributed.fsdp._runtime_utils:_register_pre_backward_hooks"
"""


def test_without_torch_ranges_the_removed_and_moved_code_refuse_the_new_leg_whole(readings, legs, install, capsys):
    path = readings / f"{GUIDE_ID}.md"
    path.write_text(guide(anchors=PREFETCH_ANCHOR + UNSHARD_ANCHOR + UNSCOPED, body=BODY))
    install(legs["2.13"])
    assert approve("--matrix", "2.13,2.15", GUIDE_ID) == 0
    before = (readings / "anchors.lock").read_text()
    capsys.readouterr()
    install(legs["2.15"])
    assert approve(GUIDE_ID) == 6  # refused until the guide is re-read and scoped
    out = capsys.readouterr().out
    assert "removed: torch.distributed.fsdp._runtime_utils has no `_register_pre_backward_hooks`" in out
    assert f"{GUIDE_ID}/doc: pattern lost" in out
    assert (readings / "anchors.lock").read_text() == before  # all or nothing: 2.15's prefetch not recorded


def test_a_version_never_read_fails_against_the_nearest_older_approval(readings, legs, install, tmp_path: Path):
    install(legs["2.13"])
    approve("--matrix", "2.13,2.15", GUIDE_ID)
    install(legs["2.15"])
    approve(GUIDE_ID)
    between = tree(tmp_path / "t214", "2.14.1", code="    handle._prefetched = False")
    found = drift(readings, between)
    assert found.kind is DriftKind.CODE and not found.ok
    assert found.approved is not None and found.approved.approved_on == ("2.13.0",)
    assert "matches none of the 2 sources approved (torch 2.13.0; 2.15.0)" in found.summary
    assert "-    handle._prefetched = True\n+    handle._prefetched = False\n" in found.diff
    below = tree(tmp_path / "t212", "2.12.0", code="    handle._prefetched = False")
    assert drift(readings, below).approved.approved_on == ("2.13.0",)  # type: ignore[union-attr]
    above = tree(tmp_path / "t216", "2.16.0", code="    handle._prefetched = False")
    assert drift(readings, above).approved.approved_on == ("2.15.0",)  # type: ignore[union-attr]


def test_approving_outside_the_matrix_is_refused(readings, legs, install, tmp_path: Path, capsys):
    install(legs["2.13"])
    approve("--matrix", "2.13,2.15", GUIDE_ID)
    capsys.readouterr()
    before = (readings / "anchors.lock").read_text()
    install(tree(tmp_path / "t214", "2.14.1"))
    assert approve(GUIDE_ID) == 2  # this torch cannot be approved on as asked: the command needs --matrix
    out = capsys.readouterr().out
    assert "torch 2.14.1 is not a release of the lock's matrix (2.13.0, 2.15.0)" in out
    assert f"fsdp-readings approve --matrix 2.13.0,2.14.1,2.15.0 {GUIDE_ID}" in out
    assert (readings / "anchors.lock").read_text() == before


def test_without_a_matrix_approving_new_code_unapproves_the_old(readings, legs, install):
    install(legs["2.13"])
    approve(GUIDE_ID)
    install(legs["2.15"])
    approve(GUIDE_ID)
    lock = Lock.load(readings / "anchors.lock")
    assert lock.releases_of(GUIDE_ID) == ("2.15.0",)
    entry = lock.get(GUIDE_ID, "prefetch")
    assert entry is not None and [s.approved_on for s in entry.sources] == [("2.15.0",)]
    assert lock.get(GUIDE_ID, "hooks") is None  # read only on 2.13, which is no longer approved
    assert drift(readings, legs["2.13"]).kind is DriftKind.CODE


def test_notes_scoped_to_versions_are_checked_only_there(readings, legs, install):
    # 2.13 has no `_prefetch_count`: its scoped note neither fails the anchor nor shows.
    assert drift(readings, legs["2.13"]).problems == []
    assert drift(readings, legs["2.15"]).problems == []
    text = (readings / f"{GUIDE_ID}.md").read_text()
    unscoped = text.replace(" [torch >=2.15]:", ":")
    install(legs["2.13"])
    approve("--matrix", "2.13,2.15", GUIDE_ID)
    install(legs["2.15"])
    approve(GUIDE_ID)
    (readings / f"{GUIDE_ID}.md").write_text(unscoped)
    assert drift(readings, legs["2.15"]).kind is DriftKind.UNCHANGED
    problem = drift(readings, legs["2.13"])
    assert problem.kind is DriftKind.PATTERN_LOST
    note_line = unscoped.splitlines().index('note "handle._prefetch_count = 1": 2.15 also counts prefetches.') + 1
    assert problem.current is not None
    assert problem.problems == [
        f"readings/{GUIDE_ID}.md:{note_line}: note pattern `handle._prefetch_count = 1` matches nowhere in "
        f"`prefetch` ({problem.current.span()}); re-read the code and repin the note"
    ]


def test_a_bad_note_scope_names_its_line(readings, legs, capsys):
    path = readings / f"{GUIDE_ID}.md"
    path.write_text(path.read_text().replace("[torch >=2.15]", "[torch newest]"))
    assert cli(["drift", "--torch-source", str(legs["2.13"].root)]) == 2
    out = capsys.readouterr().out
    assert f"{GUIDE_ID}.md" in out and "`[torch newest]` is not a PEP 440 version specifier" in out


def test_narrowing_the_matrix_drops_what_only_older_releases_read(readings, legs, install, capsys):
    install(legs["2.13"])
    approve("--matrix", "2.13,2.15", GUIDE_ID)
    install(legs["2.15"])
    approve(GUIDE_ID)
    capsys.readouterr()
    assert approve("--matrix", "2.15.0+cu132", GUIDE_ID) == 0  # a build tag names the same release
    out = capsys.readouterr().out
    assert f"dropped {GUIDE_ID}/prefetch's source from 2.13.0" in out
    assert f"dropped {GUIDE_ID}'s approval on 2.13.0" in out
    lock = Lock.load(readings / "anchors.lock")
    assert lock.matrix == ("2.15.0",) and lock.releases_of(GUIDE_ID) == ("2.15.0",)
    entry = lock.get(GUIDE_ID, "prefetch")
    assert entry is not None and [s.approved_on for s in entry.sources] == [("2.15.0",)]
    unshard = lock.get(GUIDE_ID, "unshard")  # 2.13's source, which 2.15 reads too, stays
    assert unshard is not None and [s.approved_on for s in unshard.sources] == [("2.13.0",)]
    assert approve("--matrix", "", GUIDE_ID) == 0
    assert '"torch_matrix"' not in (readings / "anchors.lock").read_text()


def test_a_matrix_lock_round_trips_and_rejects_a_bad_matrix(readings, legs, install):
    install(legs["2.13"])
    approve("--matrix", "2.13,2.15", GUIDE_ID)
    install(legs["2.15"])
    approve(GUIDE_ID)
    path = readings / "anchors.lock"
    text = path.read_text()
    assert Lock.loads(text, path).dumps() == text
    document = json.loads(text)
    assert document["torch_matrix"] == ["2.13.0", "2.15.0"]
    assert [u["approved_on"] for u in document["anchors"][f"{GUIDE_ID}/prefetch"]["updates"]] == [["2.15.0"]]
    with pytest.raises(LockError, match=r"anchors.lock:\d+: `2.x` is not a torch release"):
        Lock.loads(text.replace('"2.15.0"\n  ]', '"2.x"\n  ]'), path)


def test_the_committed_lock_is_approved_on_its_matrix_every_guide_on_every_release():
    """The releases README names (2.13.0, 2.14.1, 2.15.0): every guide approved on each, its claims having run
    there (held, or skipped by their torch range; none failed, none forced), and every source read on a release
    of the matrix."""
    readings = Path(__file__).parents[2] / "readings"
    lock = Lock.load(readings / "anchors.lock")
    assert lock.entries and lock.matrix == ("2.13.0", "2.14.1", "2.15.0")
    guides = {p.stem for p in readings.glob("[0-9][0-9]-*.md")}
    assert set(lock.guides) == guides
    for guide_id, records in lock.guides.items():
        assert tuple(records) == lock.matrix or sorted(records) == list(lock.matrix), guide_id
        for record in records.values():
            assert record.held is not None, f"{guide_id}: approved before claims were recorded"
            assert (record.failed, record.not_run, record.forced) == ((), (), None), guide_id
    assert {v for e in lock.entries.values() for s in e.sources for v in s.approved_on} <= set(lock.matrix)


def test_each_leg_of_the_matrix_passes_the_pytest_gate(
    pytester: pytest.Pytester, readings: Path, legs, install, *, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    install(legs["2.13"])
    approve("--matrix", "2.13,2.15", GUIDE_ID)
    install(legs["2.15"])
    approve(GUIDE_ID)
    monkeypatch.chdir(pytester.path)
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:hypothesispytest -p reader.plugin\n")
    target = pytester.path / "readings"
    target.mkdir()
    for file in readings.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    # Each leg skips the anchors scoped to the other: 2.13 reads `doc` and `hooks`, 2.15 reads `doc-2.15`.
    pytester.runpytest("readings/", "--torch-source", str(legs["2.13"].root)).assert_outcomes(passed=4, skipped=1)
    pytester.runpytest("readings/", "--torch-source", str(legs["2.15"].root)).assert_outcomes(passed=3, skipped=2)
    between = tree(tmp_path / "t214", "2.14.1", code="    handle._prefetched = False")
    result = pytester.runpytest("readings/", "--torch-source", str(between.root), "--drift-report", "gate.md")
    result.assert_outcomes(passed=3, failed=1, skipped=1)
    assert "matches none of the 2 sources approved" in (pytester.path / "gate.md").read_text()


def test_the_lock_diff_of_an_approval_is_the_torch_change(readings: Path, install, tmp_path: Path):
    """Approving 2.15 after 2.13 on the matrix: the entries whose code did not change stay byte-identical, the
    changed one gains its changes (not a second copy), the guide its record; no build tag appears."""
    (readings / f"{GUIDE_ID}.md").write_text(guide(anchors=PREFETCH_ANCHOR + UNSHARD_ANCHOR))
    install(tree(tmp_path / "t213", "2.13.0+cpu"))
    approve("--matrix", "2.13,2.15", GUIDE_ID)
    before = (readings / "anchors.lock").read_text()
    install(tree(tmp_path / "t215", "2.15.0+cu132", code="    handle._prefetched = prefetch_mode is not None"))
    approve(GUIDE_ID)
    after = (readings / "anchors.lock").read_text()
    diff = [
        line
        for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
        if not line.startswith(("---", "+++", "@@"))
    ]
    assert diff == [
        '-      "symbol": "torch.distributed.fsdp._runtime_utils:_prefetch_handle"',
        '+      "symbol": "torch.distributed.fsdp._runtime_utils:_prefetch_handle",',
        '+      "updates": [',
        "+        {",
        '+          "approved_on": [',
        '+            "2.15.0"',
        "+          ],",
        '+          "changes": [',
        '+            "@@ -29,1 +29,1 @@",',
        '+            "-    handle._prefetched = True",',
        '+            "+    handle._prefetched = prefetch_mode is not None"',
        "+          ],",
        '+          "file": "torch/distributed/fsdp/_runtime_utils.py",',
        '+          "lines": "17-29"',
        "+        }",
        "+      ]",
        "+      },",
        '+      "2.15.0": {',
        '+        "claims_held": 0',
    ]
    assert "+cpu" not in after and "+cu132" not in after


def test_narrowing_keeps_a_guide_approved_on_no_release_of_the_new_matrix(readings, legs, install, capsys):
    install(legs["2.13"])
    approve("--matrix", "2.13,2.15", GUIDE_ID)
    before = Lock.load(readings / "anchors.lock")
    capsys.readouterr()
    assert approve("--matrix", "2.15") == 0  # nothing drifts on 2.13: only the matrix changes
    assert f"kept {GUIDE_ID}'s approval on 2.13.0: it has none on a release of the matrix" in capsys.readouterr().out
    after = Lock.load(readings / "anchors.lock")
    assert after.matrix == ("2.15.0",) and after.guides == before.guides and after.entries == before.entries
