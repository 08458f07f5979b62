"""The lock file: canonical, diff-friendly, byte-identical round trips, and malformed input reported by
line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reader.gate.lock import Lock, LockEntry, LockError, approve
from reader.source.fingerprint import ALGORITHM, Fingerprints, fingerprint

SOURCE = "def f(x):\n    return x + 1  # one\n"


def entry(source: str = SOURCE, versions: tuple[str, ...] = ("2.13.0",)) -> LockEntry:
    return LockEntry(
        symbol="torch.m:f",
        pattern=None,
        file="torch/m.py",
        lines=(3, 4),
        source=source,
        fingerprints=fingerprint(source),
        approved_on=versions,
    )


def test_layout_is_sorted_one_line_per_element(tmp_path: Path):
    lock = Lock(tmp_path / "anchors.lock", {"b-guide/x": entry(), "a-guide/y": entry()})
    text = lock.dumps()
    assert text.endswith("}\n")
    assert text.index('"a-guide/y"') < text.index('"b-guide/x"')
    assert '\n        "def f(x):",\n        "    return x + 1  # one"\n' in text
    assert '"lines": "3-4"' in text
    assert list(json.loads(text)) == ["anchors", "fingerprint_algorithm", "format", "note"]


def test_save_is_atomic_and_idempotent(tmp_path: Path):
    lock = Lock(tmp_path / "readings" / "anchors.lock", {"g/a": entry()})
    assert lock.save() is True
    assert lock.save() is False  # same bytes: nothing written
    assert Lock.load(lock.path).entries == lock.entries
    assert [p.name for p in lock.path.parent.iterdir()] == ["anchors.lock"]  # no temp files left behind


def test_missing_lock_is_empty(tmp_path: Path):
    assert Lock.load(tmp_path / "nope.lock").entries == {}


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda text: text.replace('"format": 1', '"format": 99'), "format 1"),
        (lambda text: text[:-3], "not valid JSON"),
        (
            lambda text: text.replace('"lines": "3-4"', '"lines": [3, 4]'),
            'entry g/a: `lines` must be "first-last"',
        ),
        (lambda text: text.replace('"symbol":', '"symbo":'), "entry g/a: missing `symbol`"),
    ],
)
def test_malformed_lock_names_file_and_line(tmp_path: Path, mutate, message: str):
    path = tmp_path / "anchors.lock"
    path.write_text(mutate(Lock(path, {"g/a": entry()}).dumps()))
    with pytest.raises(LockError) as info:
        Lock.load(path)
    assert message in info.value.message and info.value.line >= 1 and info.value.path == path


def test_old_algorithm_fingerprints_are_recomputed_from_the_source(tmp_path: Path):
    stale = Fingerprints("old", "old", "old", None)
    lock = Lock(
        tmp_path / "l.lock",
        {"g/a": LockEntry("torch.m:f", None, "torch/m.py", (1, 2), SOURCE, stale, ("2.1",))},
        algorithm=ALGORITHM - 1,
    )
    assert lock.approved_fingerprints(lock.entries["g/a"]) == fingerprint(SOURCE)
    lock.save()
    reloaded = Lock.load(lock.path)
    assert reloaded.algorithm == ALGORITHM and reloaded.entries["g/a"].fingerprints == fingerprint(SOURCE)


def test_approve_keeps_version_history_only_for_identical_source():
    first = approve(
        None,
        symbol="torch.m:f",
        pattern=None,
        file="torch/m.py",
        lines=(1, 2),
        source=SOURCE,
        torch_version="2.13.0",
    )
    again = approve(
        first,
        symbol="torch.m:f",
        pattern=None,
        file="torch/m.py",
        lines=(5, 6),
        source=SOURCE,
        torch_version="2.10.0",
    )
    assert again.approved_on == ("2.10.0", "2.13.0") and again.lines == (5, 6)
    changed = approve(
        again,
        symbol="torch.m:f",
        pattern=None,
        file="torch/m.py",
        lines=(5, 6),
        source=SOURCE.replace("1", "2"),
        torch_version="2.14.0",
    )
    assert changed.approved_on == ("2.14.0",)


# Source lines as torch could contain them: tabs, trailing spaces, unicode, quotes, backslashes, blank lines.
LINE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=40)
SOURCES = st.lists(LINE, min_size=1, max_size=8).map(lambda lines: "\n".join(lines) + "\n")
VERSIONS = st.lists(
    st.sampled_from(["2.13.0+cpu", "2.13.1", "2.14.0a0", "2.14.0.dev20250101", "2.15.0"]),
    min_size=1,
    max_size=3,
    unique=True,
).map(tuple)
NAME = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10)
HEX = st.text("0123456789abcdef", min_size=64, max_size=64)
ENTRIES = st.builds(
    LockEntry,
    symbol=st.builds(lambda m, q: f"torch.distributed.{m}:{q}", NAME, NAME),
    pattern=st.none() | LINE.filter(str.strip),
    file=st.builds(lambda m: f"torch/distributed/{m}.py", NAME),
    lines=st.tuples(st.integers(1, 5000), st.integers(1, 5000)),
    source=SOURCES,
    fingerprints=st.builds(Fingerprints, HEX, HEX, HEX, st.none() | HEX),
    approved_on=VERSIONS,
)
KEYS = st.builds(lambda g, a: f"{g}/{a}", NAME, st.text("abcdefghijklmnopqrstuvwxyz_.-", min_size=1, max_size=10))


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(KEYS, ENTRIES, max_size=5))
def test_lock_serialization_round_trips_byte_identically(entries: dict[str, LockEntry]):
    path = Path("readings/anchors.lock")
    text = Lock(path, entries).dumps()
    loaded = Lock.loads(text, path)
    assert loaded.entries == entries
    assert loaded.dumps() == text
