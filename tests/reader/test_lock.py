"""The lock file: canonical, diff-friendly, byte-identical round trips, later sources stored as their changes,
format 1 read as what it says, and malformed input reported by line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reader.gate.lock import ApprovedSource, GuideRecord, Lock, LockEntry, LockError, approve
from reader.gate.source_changes import ChangeError, apply, changes

SOURCE = "def f(x):\n    return x + 1  # one\n"
CHANGED = "def f(x):\n    y = x\n    return y + 2  # one\n"


def entry(*sources: tuple[str, tuple[str, ...]]) -> LockEntry:
    made = [ApprovedSource("torch/m.py", (3, 3 + text.count("\n") - 1), text, on) for text, on in sources]
    return LockEntry("torch.m:f", None, tuple(made or [ApprovedSource("torch/m.py", (3, 4), SOURCE, ("2.13.0",))]))


def test_layout_is_sorted_one_line_per_element(tmp_path: Path):
    lock = Lock(tmp_path / "anchors.lock", {"b-guide/x": entry(), "a-guide/y": entry()})
    lock.guides = {"a-guide": {"2.13.0": GuideRecord(held=3)}}
    text = lock.dumps()
    assert text.endswith("}\n")
    assert text.index('"a-guide/y"') < text.index('"b-guide/x"')
    assert '\n        "def f(x):",\n        "    return x + 1  # one"\n' in text
    assert '"lines": "3-4"' in text
    assert list(json.loads(text)) == ["anchors", "format", "guides", "note"]
    assert json.loads(text)["guides"] == {"a-guide": {"2.13.0": {"claims_held": 3}}}
    assert "fingerprint" not in text  # hashes are computed from the text, never reviewed


def test_a_later_source_is_stored_as_its_changes_in_torch_line_numbers(tmp_path: Path):
    two = entry((SOURCE, ("2.13.0",)), (CHANGED, ("2.15.0",)))
    text = Lock(tmp_path / "l.lock", {"g/a": two}).dumps()
    (update,) = json.loads(text)["anchors"]["g/a"]["updates"]
    assert update == {
        "approved_on": ["2.15.0"],
        "changes": ["@@ -4,1 +4,2 @@", "-    return x + 1  # one", "+    y = x", "+    return y + 2  # one"],
        "file": "torch/m.py",
        "lines": "3-5",
    }
    assert text.count('"def f(x):"') == 1 and text.count("y = x") == 1  # each release's source stored once
    assert Lock.loads(text, tmp_path / "l.lock").entries["g/a"] == two


def test_changes_that_do_not_apply_are_refused():
    hunks = changes(SOURCE, 10, CHANGED, 10)
    assert apply(SOURCE, 10, hunks) == CHANGED
    with pytest.raises(ChangeError, match="does not apply"):
        apply(SOURCE.replace("+ 1", "+ 9"), 10, hunks)  # a `-` line that is not in the source
    with pytest.raises(ChangeError, match="not a hunk header"):
        apply(SOURCE, 10, ["-    return x + 1  # one"])


def test_save_is_atomic_and_idempotent(tmp_path: Path):
    lock = Lock(tmp_path / "readings" / "anchors.lock", {"g/a": entry()})
    assert lock.save() is True
    assert lock.save() is False  # same bytes: nothing written
    assert Lock.load(lock.path).entries == lock.entries
    assert [p.name for p in lock.path.parent.iterdir()] == ["anchors.lock"]  # no temp files left behind


def test_missing_lock_is_empty(tmp_path: Path):
    assert Lock.load(tmp_path / "nope.lock").entries == {}


def two_sources(path: Path) -> str:
    lock = Lock(path, {"g/a": entry((SOURCE, ("2.13.0",)), (CHANGED, ("2.15.0",)))})
    lock.guides = {"g": {"2.13.0": GuideRecord(held=2), "2.15.0": GuideRecord(held=1, failed=("x",), forced="why")}}
    return lock.dumps()


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda text: text.replace('"format": 2', '"format": 99'), "format 1 or 2"),
        (lambda text: text[:-3], "not valid JSON"),
        (lambda text: text.replace('"lines": "3-4"', '"lines": [3, 4]'), 'entry g/a: `lines` must be "first-last"'),
        (lambda text: text.replace('"symbol":', '"symbo":'), "entry g/a: missing `symbol`"),
        (lambda text: text.replace('"-    return x + 1', '"-    return x + 7'), "entry g/a: hunk `@@ -4,1 +4,2 @@`"),
        (lambda text: text.replace('"claims_held": 2', '"claims_held": "all"'), "guide g, torch 2.13.0: `claims_held`"),
        (lambda text: text.replace('"forced": "why"', '"forced": ""'), "guide g, torch 2.15.0: `forced` must be"),
        (lambda text: text.replace(',\n        "forced": "why"', ""), "recorded only with the `forced` reason"),
    ],
)
def test_malformed_lock_names_file_and_line(tmp_path: Path, mutate, message: str):
    path = tmp_path / "anchors.lock"
    good = two_sources(path)
    path.write_text(mutate(good))
    assert path.read_text() != good
    with pytest.raises(LockError) as info:
        Lock.load(path)
    assert message in info.value.message and info.value.path == path
    assert info.value.line > 1 or message in ("format 1 or 2", "not valid JSON")


FORMAT_1 = {
    "format": 1,
    "fingerprint_algorithm": 1,
    "note": "...",
    "torch_matrix": ["2.13", "2.15"],
    "anchors": {
        "g/a": {
            "approved_on": ["2.15.0+cu132"],
            "file": "torch/m.py",
            "fingerprints": {"exact": "x", "normalized": "x", "annotations": "x", "signature": None},
            "lines": "3-5",
            "pattern": None,
            "source": CHANGED[:-1].split("\n"),
            "symbol": "torch.m:f",
            "also_approved": [
                {
                    "approved_on": ["2.13.0+cpu"],
                    "file": "torch/m.py",
                    "fingerprints": {"exact": "y", "normalized": "y", "annotations": "y", "signature": None},
                    "lines": "3-4",
                    "source": SOURCE[:-1].split("\n"),
                }
            ],
        }
    },
}


def test_a_format_1_lock_reads_as_what_it_says_and_is_written_as_format_2(tmp_path: Path):
    path = tmp_path / "anchors.lock"
    path.write_text(json.dumps(FORMAT_1))
    lock = Lock.load(path)
    assert lock.matrix == ("2.13.0", "2.15.0")  # releases, not strings: build tags and spellings gone
    found = lock.entries["g/a"]
    assert [(s.source, s.approved_on) for s in found.sources] == [(SOURCE, ("2.13.0",)), (CHANGED, ("2.15.0",))]
    assert lock.guides == {"g": {"2.13.0": GuideRecord(held=None), "2.15.0": GuideRecord(held=None)}}
    assert lock.save()
    written = json.loads(path.read_text())
    assert written["format"] == 2 and written["guides"]["g"]["2.15.0"] == {"claims_held": None}


def test_each_release_reads_the_source_it_holds_from():
    three = entry((SOURCE, ("2.13.0",)), (CHANGED, ("2.15.0",)))
    assert three.serving("2.12.0") is None
    assert three.serving("2.13.0").source == SOURCE  # type: ignore[union-attr]
    assert three.serving("2.14.1").source == SOURCE  # type: ignore[union-attr]
    assert three.serving("2.16.0").source == CHANGED  # type: ignore[union-attr]
    assert three.for_version("2.12.0+cpu").source == SOURCE  # below all: the oldest, for a diff


def approve_at(previous: LockEntry | None, text: str, at: str, keep: tuple[str, ...] = (), lines=(1, 2)) -> LockEntry:
    return approve(
        previous, symbol="torch.m:f", pattern=None, file="torch/m.py", lines=lines, source=text, torch_version=at,
        keep=keep,
    )  # fmt: skip


def test_approving_unchanged_source_changes_nothing_and_a_change_adds_one_source():
    first = approve_at(None, SOURCE, "2.13.0+cpu")
    assert [s.approved_on for s in first.sources] == [("2.13.0",)]
    assert approve_at(first, SOURCE, "2.15.0+cu132", keep=("2.13.0",)) == first  # matrix: same text, same entry
    assert approve_at(first, SOURCE, "2.15.0") == first  # no matrix either: it holds from 2.13.0 on
    moved = approve_at(first, SOURCE, "2.15.0", lines=(7, 8))
    assert moved.sources[0].lines == (7, 8) and moved.sources[0].approved_on == ("2.13.0",)
    both = approve_at(first, CHANGED, "2.15.0", keep=("2.13.0",))
    assert [(s.source, s.approved_on) for s in both.sources] == [(SOURCE, ("2.13.0",)), (CHANGED, ("2.15.0",))]
    replaced = approve_at(first, CHANGED, "2.15.0")  # no matrix: the new text replaces the old
    assert [(s.source, s.approved_on) for s in replaced.sources] == [(CHANGED, ("2.15.0",))]
    cosmetic = SOURCE.replace("# one", "# reworded")
    assert approve_at(first, cosmetic, "2.15.0", keep=("2.13.0",)) == first  # matrix: no second copy
    assert approve_at(first, cosmetic, "2.15.0").sources[0].source == cosmetic  # one release: the text read


def test_an_annotation_change_is_a_source_of_its_own_in_a_matrix():
    # Drift judges a change of annotations alone as not cosmetic, so the release that has it needs its own
    # approved source; folding it into the old one would fail that release's anchor ever after.
    annotated = SOURCE.replace("def f(x):", "def f(x) -> int:")
    first = approve_at(None, SOURCE, "2.13.0")
    both = approve_at(first, annotated, "2.14.1", keep=("2.13.0",))
    assert [(s.source, s.approved_on) for s in both.sources] == [(SOURCE, ("2.13.0",)), (annotated, ("2.14.1",))]


def test_a_release_between_and_a_revert_keep_every_release_on_its_own_source():
    both = approve_at(approve_at(None, SOURCE, "2.13.0"), CHANGED, "2.15.0", keep=("2.13.0",))
    # 2.14 has 2.15's code: 2.15's source now holds from 2.14 on.
    middle = approve_at(both, CHANGED, "2.14.0", keep=("2.13.0", "2.15.0"))
    assert [s.approved_on for s in middle.sources] == [("2.13.0",), ("2.14.0", "2.15.0")]
    assert middle.serving("2.15.0").source == CHANGED  # type: ignore[union-attr]
    # 2.16 goes back to 2.13's code: that source holds again from 2.16.
    reverted = approve_at(middle, SOURCE, "2.16.0", keep=("2.13.0", "2.14.0", "2.15.0"))
    assert [s.approved_on for s in reverted.sources] == [("2.13.0", "2.16.0"), ("2.14.0", "2.15.0")]
    assert [reverted.serving(r).source for r in ("2.13.0", "2.14.0", "2.15.0", "2.16.0")] == [  # type: ignore[union-attr]
        SOURCE, CHANGED, CHANGED, SOURCE,
    ]  # fmt: skip


# Source lines as torch could contain them: tabs, trailing spaces, unicode, quotes, backslashes, blank lines.
LINE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=40)
SOURCES = st.lists(LINE, min_size=1, max_size=8).map(lambda lines: "\n".join(lines) + "\n")
RELEASES = st.sampled_from(["2.13.0", "2.13.1", "2.14.0a0", "2.14.0.dev20250101", "2.15.0", "2.16.0"])
NAME = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10)
SOURCES_OF_AN_ANCHOR = st.lists(
    st.builds(
        lambda m, first, text: ApprovedSource(f"torch/distributed/{m}.py", (first, first + text.count("\n")), text, ()),
        NAME,
        st.integers(1, 5000),
        SOURCES,
    ),
    min_size=1,
    max_size=3,
)
RELEASE_LIST = ["2.13.0", "2.14.0", "2.15.0", "2.16.0", "2.17.0", "2.18.0"]
ENTRIES = st.builds(
    lambda symbol, pattern, sources: LockEntry(
        symbol,
        pattern,
        tuple(
            ApprovedSource(s.file, s.lines, s.source, (RELEASE_LIST[2 * i], RELEASE_LIST[2 * i + 1]))
            for i, s in enumerate(sources)
        ),
    ),
    st.builds(lambda m, q: f"torch.distributed.{m}:{q}", NAME, NAME),
    st.none() | LINE.filter(str.strip),
    SOURCES_OF_AN_ANCHOR,
)
KEYS = st.builds(lambda g, a: f"{g}/{a}", NAME, st.text("abcdefghijklmnopqrstuvwxyz_.-", min_size=1, max_size=10))
RECORDS = st.builds(
    GuideRecord,
    held=st.none() | st.integers(0, 40),
    skipped=st.lists(NAME, max_size=2).map(tuple),
)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(KEYS, ENTRIES, max_size=5),
    st.dictionaries(NAME, st.dictionaries(RELEASES, RECORDS, max_size=2), max_size=3),
)
def test_lock_serialization_round_trips_byte_identically(
    entries: dict[str, LockEntry], guides: dict[str, dict[str, GuideRecord]]
):
    path = Path("readings/anchors.lock")
    lock = Lock(path, entries, guides)
    text = lock.dumps()
    loaded = Lock.loads(text, path)
    assert loaded.entries == entries and loaded.guides == guides
    assert loaded.dumps() == text
