"""The reading path and the glossary (`reader.format.path`): every guide on exactly one track, every term tied to
a guide that uses it, and bad entries named with their line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reader.format.errors import GuideError
from reader.format.guide import Prose, SourceBlock
from reader.format.parse import load_all
from reader.format.path import load_glossary, load_path

READINGS = Path(__file__).resolve().parents[2] / "readings"
GUIDES, _ = load_all([READINGS], None)
IDS = [g.id for g in GUIDES]


def test_every_guide_is_on_exactly_one_track_and_the_start_is_the_first_of_the_first() -> None:
    path = load_path(READINGS, IDS)
    on_tracks = [g for track in path.tracks for g in track.guides]
    assert sorted(on_tracks) == sorted(IDS)
    assert path.start == path.tracks[0].guides[0]


def test_the_next_guide_follows_the_track_then_the_next_track() -> None:
    path = load_path(READINGS, IDS)
    first, second = path.tracks[0], path.tracks[1]
    assert path.after(first.guides[0]) == (first.guides[1], first, 1)
    assert path.after(first.guides[-1]) == (second.guides[0], second, 0)
    assert path.after(path.tracks[-1].guides[-1]) is None
    assert path.place("99-nothing") is None and path.after("99-nothing") is None


def _copy(tmp_path: Path) -> Path:
    readings = tmp_path / "readings"
    readings.mkdir()
    for name in ("path.toml", "glossary.toml"):
        shutil.copy(READINGS / name, readings / name)
    return readings


def test_a_track_naming_no_guide_or_a_guide_twice_is_named_at_its_line(tmp_path: Path) -> None:
    readings = _copy(tmp_path)
    text = (readings / "path.toml").read_text()
    text = text.replace('"02-root-and-lazy-init"', '"02-root-and-lazy-int", "01-step-map"')
    (readings / "path.toml").write_text(text)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "02-root-and-lazy-int" in row)
    with pytest.raises(GuideError) as raised:
        load_path(readings, IDS)
    found = {(p.line, p.message) for p in raised.value.problems}
    assert (line, "track `Around the step` names `02-root-and-lazy-int`, which is no guide") in found
    assert (line, "`01-step-map` is on two tracks: `The FSDP1 step` and `Around the step`") in found
    assert any(p.fix == "did you mean `02-root-and-lazy-init`?" for p in raised.value.problems)


def test_every_term_sees_a_guide_that_uses_the_word(tmp_path: Path) -> None:
    terms = load_glossary(READINGS, IDS)
    assert {"unit", "handle", "flat parameter", "post-forward order", "ring model", "the seeds"} <= {
        t.term for t in terms
    }
    by_id = {g.id: g for g in GUIDES}
    for term in terms:
        guide = by_id[term.see]
        words = " ".join(r.text for r in guide.regions_of(Prose)).casefold()
        words += " ".join(n.text for b in guide.regions_of(SourceBlock) for n in b.notes).casefold()
        stem = term.term.removeprefix("the ").casefold().rstrip("s")
        assert stem in words, (term.term, term.see)


def test_a_term_defined_twice_or_seeing_no_guide_is_named(tmp_path: Path) -> None:
    readings = _copy(tmp_path)
    text = (readings / "glossary.toml").read_text()
    text += '\n[[terms]]\nterm = "Unit"\nmeans = "again"\nsee = "99-nothing"\n'
    (readings / "glossary.toml").write_text(text)
    with pytest.raises(GuideError) as raised:
        load_glossary(readings, IDS)
    messages = [p.message for p in raised.value.problems]
    assert "`Unit` is defined twice" in messages and "`Unit` sees `99-nothing`, which is no guide" in messages
