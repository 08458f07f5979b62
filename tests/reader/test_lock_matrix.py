"""A lock approved on a matrix of torch versions: one approved source per version where the code differs, each
leg judged against its own, notes scoped to the versions they hold for, and a version never read failing clearly.

The fixture is two synthetic torch trees whose `_prefetch_handle` differs (2.13.0+cpu and 2.15.0), approved in
turn through `fsdp-readings approve --matrix 2.13,2.15`, as a team keeping both legs green would.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reader.commands.app import main
from reader.format.guide import Guide
from reader.format.parse import parse_guide
from reader.gate.drift import Drift, DriftKind
from reader.gate.lock import Lock, LockError
from reader.gate.workspace import Workspace
from reader.source.index import IndexCache
from tests.reader.reader_support import PREFETCH_ANCHOR, UNSHARD_ANCHOR, TorchTree, guide, make_tree

RUNTIME = "torch/distributed/fsdp/_runtime_utils.py"
OLD_LINE = "    handle._prefetched = True"
NEW_LINE = "    handle._prefetched = True\n    handle._prefetch_count = 1"
GUIDE_ID = "04-forward-prefetch"
BODY = """
# Prefetch

```source prefetch
note "handle._prefetched = True": the mark that stops a second prefetch.
note "handle._prefetch_count = 1" [torch >=2.15]: 2.15 also counts prefetches.
```
"""


def tree(root: Path, version: str, *, code: str = OLD_LINE) -> TorchTree:
    made = make_tree(root)
    made.set_version(version)
    if code != OLD_LINE:
        made.edit(RUNTIME, OLD_LINE, code)
    return made


@pytest.fixture
def readings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    directory = tmp_path / "readings"
    directory.mkdir()
    (directory / f"{GUIDE_ID}.md").write_text(guide(anchors=PREFETCH_ANCHOR + UNSHARD_ANCHOR, body=BODY))
    return directory


@pytest.fixture
def legs(tmp_path: Path) -> dict[str, TorchTree]:
    return {
        "2.13": tree(tmp_path / "t213", "2.13.0+cpu"),
        "2.15": tree(tmp_path / "t215", "2.15.0", code=NEW_LINE),
    }


def approve(tree_: TorchTree, *extra: str) -> int:
    return main(["approve", "--torch-source", str(tree_.root), *extra])


def drift(readings: Path, tree_: TorchTree, anchor: str = "prefetch") -> Drift:
    g: Guide = parse_guide((readings / f"{GUIDE_ID}.md").read_text(), readings / f"{GUIDE_ID}.md")
    workspace = Workspace(tree_.source(), readings / "anchors.lock", IndexCache())
    return workspace.drift(g, g.anchor(anchor))


def test_both_legs_pass_once_each_is_approved_on_its_own_source(readings: Path, legs: dict[str, TorchTree]):
    assert approve(legs["2.13"], "--matrix", "2.13,2.15") == 0
    assert drift(readings, legs["2.15"]).kind is DriftKind.CODE  # 2.15's code not yet read
    assert approve(legs["2.15"]) == 0  # the matrix is stored in the lock: no flag needed again
    lock = Lock.load(readings / "anchors.lock")
    assert lock.matrix == ("2.13", "2.15")
    entry = lock.get(GUIDE_ID, "prefetch")
    assert entry is not None
    assert [s.approved_on for s in entry.sources] == [("2.15.0",), ("2.13.0+cpu",)]  # newest first
    assert "_prefetch_count" in entry.source and "_prefetch_count" not in entry.also_approved[0].source
    unshard = lock.get(GUIDE_ID, "unshard")
    assert unshard is not None and unshard.approved_on == ("2.13.0+cpu", "2.15.0") and not unshard.also_approved
    for leg in legs.values():
        assert drift(readings, leg).kind is DriftKind.UNCHANGED
        assert drift(readings, leg, "unshard").kind is DriftKind.UNCHANGED
    # Re-approving an unchanged leg is a no-op: the other leg's source stays.
    before = (readings / "anchors.lock").read_text()
    assert approve(legs["2.13"]) == 0 and (readings / "anchors.lock").read_text() == before


def test_a_version_never_read_fails_against_the_nearest_older_approval(
    readings: Path, legs: dict[str, TorchTree], tmp_path: Path
):
    approve(legs["2.13"], "--matrix", "2.13,2.15")
    approve(legs["2.15"])
    between = tree(tmp_path / "t214", "2.14.1", code="    handle._prefetched = False")
    found = drift(readings, between)
    assert found.kind is DriftKind.CODE and not found.ok
    assert found.approved is not None and found.approved.approved_on == ("2.13.0+cpu",)
    assert "matches none of the 2 sources approved (torch 2.15.0; 2.13.0+cpu)" in found.summary
    assert "-    handle._prefetched = True\n+    handle._prefetched = False\n" in found.diff
    below = tree(tmp_path / "t212", "2.12.0", code="    handle._prefetched = False")
    assert drift(readings, below).approved.approved_on == ("2.13.0+cpu",)  # type: ignore[union-attr]
    above = tree(tmp_path / "t216", "2.16.0", code="    handle._prefetched = False")
    assert drift(readings, above).approved.approved_on == ("2.15.0",)  # type: ignore[union-attr]
    # Code a person read on another version is read: the gate is about source, not version numbers.
    assert drift(readings, tree(tmp_path / "t214b", "2.14.1", code=NEW_LINE)).kind is DriftKind.UNCHANGED


def test_without_a_matrix_approving_new_code_unapproves_the_old(readings: Path, legs: dict[str, TorchTree]):
    approve(legs["2.13"])
    approve(legs["2.15"])
    entry = Lock.load(readings / "anchors.lock").get(GUIDE_ID, "prefetch")
    assert entry is not None and entry.approved_on == ("2.15.0",) and not entry.also_approved
    assert drift(readings, legs["2.13"]).kind is DriftKind.CODE


def test_notes_scoped_to_versions_are_checked_only_there(readings: Path, legs: dict[str, TorchTree]):
    # 2.13 has no `_prefetch_count`: its scoped note neither fails the anchor nor shows.
    assert drift(readings, legs["2.13"]).problems == []
    assert drift(readings, legs["2.15"]).problems == []
    text = (readings / f"{GUIDE_ID}.md").read_text()
    unscoped = text.replace(" [torch >=2.15]:", ":")
    approve(legs["2.13"], "--matrix", "2.13,2.15")
    approve(legs["2.15"])
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


def test_a_bad_note_scope_names_its_line(readings: Path, legs: dict[str, TorchTree], capsys):
    path = readings / f"{GUIDE_ID}.md"
    path.write_text(path.read_text().replace("[torch >=2.15]", "[torch newest]"))
    assert main(["drift", "--torch-source", str(legs["2.13"].root)]) == 2
    out = capsys.readouterr().out
    assert f"{GUIDE_ID}.md" in out and "`[torch newest]` is not a PEP 440 version specifier" in out


def test_narrowing_the_matrix_drops_sources_outside_it(readings: Path, legs: dict[str, TorchTree], capsys):
    approve(legs["2.13"], "--matrix", "2.13,2.15")
    approve(legs["2.15"])
    capsys.readouterr()
    assert approve(legs["2.15"], "--matrix", "2.15") == 0
    assert f"dropped approved source outside the matrix: {GUIDE_ID}/prefetch (2.13.0+cpu)" in capsys.readouterr().out
    lock = Lock.load(readings / "anchors.lock")
    assert lock.matrix == ("2.15",) and not lock.get(GUIDE_ID, "prefetch").also_approved  # type: ignore[union-attr]
    assert approve(legs["2.15"], "--matrix", "") == 0
    assert '"torch_matrix"' not in (readings / "anchors.lock").read_text()


def test_a_matrix_lock_round_trips_and_rejects_a_bad_matrix(readings: Path, legs: dict[str, TorchTree]):
    approve(legs["2.13"], "--matrix", "2.13,2.15")
    approve(legs["2.15"])
    path = readings / "anchors.lock"
    text = path.read_text()
    assert Lock.loads(text, path).dumps() == text
    document = json.loads(text)
    assert document["torch_matrix"] == ["2.13", "2.15"]
    assert [a["approved_on"] for a in document["anchors"][f"{GUIDE_ID}/prefetch"]["also_approved"]] == [["2.13.0+cpu"]]
    with pytest.raises(LockError, match=r"anchors.lock:\d+: `2.x` is not a torch release"):
        Lock.loads(text.replace('"2.15"\n', '"2.x"\n'), path)


def test_the_committed_lock_is_approved_on_2_13_0_alone():
    lock = Lock.load(Path(__file__).parents[2] / "readings" / "anchors.lock")
    assert lock.entries and lock.matrix == ()
    assert {v for e in lock.entries.values() for s in e.sources for v in s.approved_on} == {"2.13.0+cpu"}
    assert not any(e.also_approved for e in lock.entries.values())


def test_each_leg_of_the_matrix_passes_the_pytest_gate(
    pytester: pytest.Pytester,
    readings: Path,
    legs: dict[str, TorchTree],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    approve(legs["2.13"], "--matrix", "2.13,2.15")
    approve(legs["2.15"])
    monkeypatch.chdir(pytester.path)
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:hypothesispytest -p reader.plugin\n")
    target = pytester.path / "readings"
    target.mkdir()
    for file in readings.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    for leg in legs.values():
        pytester.runpytest("readings/", "--torch-source", str(leg.root)).assert_outcomes(passed=2)
    between = tree(tmp_path / "t214", "2.14.1", code="    handle._prefetched = False")
    result = pytester.runpytest("readings/", "--torch-source", str(between.root), "--drift-report", "gate.md")
    result.assert_outcomes(passed=1, failed=1)
    assert "matches none of the 2 sources approved" in (pytester.path / "gate.md").read_text()
