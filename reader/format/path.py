"""The reading path (``readings/path.toml``: tracks of guides, each in reading order) and the glossary
(``readings/glossary.toml``: the words the guides use, each defined once and tied to the guide that shows it).

Both are checked against the guides they name: a track naming a guide that does not exist, a guide on two
tracks, a term defined twice, or a ``see`` that names no guide is broken input, pinned to its line.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from reader.format.errors import GuideError, Problems, did_you_mean
from reader.format.toml_fields import TomlLines

PATH_FILE = "path.toml"
GLOSSARY_FILE = "glossary.toml"


@dataclass(frozen=True)
class Track:
    name: str
    about: str
    guides: tuple[str, ...]


@dataclass(frozen=True)
class ReadingPath:
    start: str
    tracks: tuple[Track, ...]

    def place(self, guide_id: str) -> tuple[Track, int] | None:
        """The track ``guide_id`` is on and its position there (0-based), or None when it is on none."""
        for track in self.tracks:
            if guide_id in track.guides:
                return track, track.guides.index(guide_id)
        return None

    def after(self, guide_id: str) -> tuple[str, Track, int] | None:
        """The guide to read after ``guide_id``: the next on its track, else the first of the next track; with
        the track it is on and its position there. None after the last guide of the last track."""
        order = [(g, track, i) for track in self.tracks for i, g in enumerate(track.guides)]
        ids = [g for g, _, _ in order]
        if guide_id not in ids:
            return None
        following = ids.index(guide_id) + 1
        return order[following] if following < len(order) else None


@dataclass(frozen=True)
class Term:
    term: str
    means: str
    see: str


def _read(path: Path) -> tuple[dict, TomlLines, Problems]:
    text = path.read_text(encoding="utf-8")
    problems = Problems(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise GuideError.at(path, 1, f"not TOML: {exc}", "fix the TOML syntax") from exc
    return data, TomlLines(text.split("\n"), 1), problems


def load_path(readings: Path, guide_ids: Iterable[str]) -> ReadingPath:
    """``readings/path.toml``, checked against the guides that exist (`GuideError` naming each problem)."""
    path = readings / PATH_FILE
    data, lines, problems = _read(path)
    known = set(guide_ids)
    seen: dict[str, str] = {}
    tracks = []
    for i, table in enumerate(data.get("tracks", [])):
        name, guides = table.get("name"), table.get("guides")
        if not isinstance(name, str) or not isinstance(guides, list) or not guides:
            problems.add(lines.line("tracks", i), "a track needs a `name` and a list of `guides`", "add them")
            continue
        for guide_id in guides:
            where = lines.line("tracks", i, "guides")
            if guide_id not in known:
                problems.add(where, f"track `{name}` names `{guide_id}`, which is no guide", _fix(guide_id, known))
            elif guide_id in seen:
                problems.add(where, f"`{guide_id}` is on two tracks: `{seen[guide_id]}` and `{name}`", "keep one")
            seen[guide_id] = name
        tracks.append(Track(name, str(table.get("about", "")), tuple(guides)))
    start = data.get("start")
    if start not in seen:
        problems.add(lines.line("start"), f"`start = {start!r}` is on no track", "name the first guide to read")
    if problems:
        raise GuideError(problems.found)
    return ReadingPath(str(start), tuple(tracks))


def reading_path(readings: Path, guide_ids: Iterable[str] | None = None) -> ReadingPath | None:
    """The path over the guides in ``readings`` (``guide_ids``: theirs, when the caller has parsed them already),
    or None when it has none or it does not load (the ``path`` command reports its problems; a guide's next step
    is then left out)."""
    if guide_ids is None:
        from reader.format.parse import load_all

        guides, _ = load_all([readings], None)
        guide_ids = [g.id for g in guides]
    try:
        return load_path(readings, list(guide_ids))
    except (GuideError, OSError):
        return None


def load_glossary(readings: Path, guide_ids: Iterable[str]) -> tuple[Term, ...]:
    """``readings/glossary.toml``, checked against the guides that exist (`GuideError` naming each problem)."""
    path = readings / GLOSSARY_FILE
    data, lines, problems = _read(path)
    known = set(guide_ids)
    terms: list[Term] = []
    for i, table in enumerate(data.get("terms", [])):
        term, means, see = table.get("term"), table.get("means"), table.get("see")
        if not all(isinstance(v, str) and v.strip() for v in (term, means, see)):
            problems.add(lines.line("terms", i), "a term needs `term`, `means` and `see`", "add the three")
            continue
        if any(t.term.casefold() == term.casefold() for t in terms):
            problems.add(lines.line("terms", i, "term"), f"`{term}` is defined twice", "keep one definition")
        if see not in known:
            problems.add(lines.line("terms", i, "see"), f"`{term}` sees `{see}`, which is no guide", _fix(see, known))
        terms.append(Term(term, " ".join(means.split()), see))
    if problems:
        raise GuideError(problems.found)
    return tuple(terms)


def _fix(name: str, known: set[str]) -> str:
    return did_you_mean(name, known) or f"use a guide id: {', '.join(sorted(known))}"
