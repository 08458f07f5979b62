"""Parse a guide file: TOML front matter between ``+++`` lines, then the Markdown body split into regions.

The entry point; the work is done by ``reader.format.front_matter`` (the front matter → a `Guide`, with
``reader.format.specs`` for its anchors and claims) and ``reader.format.body`` (the body → regions, by the parser
registered for each fence kind; ``reader.format.blocks`` registers ```` ```source ```` and ```` ```expect ````).
Every problem of a guide is collected, not just the first, and raised together as one `GuideError`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

import reader.format.predict  # noqa: F401  (registers the ```predict parser)
from reader.format.blocks import check_block_references  # importing it registers the built-in body parsers
from reader.format.body import BODY_PARSERS, BodyContext
from reader.format.errors import GuideError, Problems
from reader.format.front_matter import FENCE, read_front_matter
from reader.format.guide import Guide
from reader.source.checkref import CheckFinder
from reader.source.files import relative_to_cwd

GUIDE_FILE_RE = re.compile(r"^\d+-[\w.-]+\.md$")  # NN-slug.md: must be a guide, so no front matter is an error


def has_front_matter(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.readline().strip() == FENCE.encode()
    except OSError:
        return False


def looks_like_guide(path: Path) -> bool:
    """Guides are files with front matter, plus any ``NN-slug.md`` (which then must have it). A README is
    not."""
    return path.suffix == ".md" and (has_front_matter(path) or bool(GUIDE_FILE_RE.match(path.name)))


def load_guide(path: Path, checks: CheckFinder | None = None) -> Guide:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise GuideError.at(path, 1, f"not UTF-8: {exc}", "save the guide as UTF-8") from exc
    return parse_guide(text, path, checks)


def parse_guide(text: str, path: Path, checks: CheckFinder | None = None) -> Guide:
    lines = text.split("\n")
    problems = Problems(path)
    front = read_front_matter(lines, path, problems, checks)
    context = BodyContext(front.guide, front.declared, problems)
    regions = BODY_PARSERS.regions(lines[front.close + 1 :], front.close + 2, context)
    check_block_references(front.guide, regions, problems)
    if problems:
        raise GuideError(problems.found)
    return replace(front.guide, regions=tuple(regions), text=text)


def discover(paths: Iterable[Path]) -> list[Path]:
    """Guide files under the given files/directories, sorted (the order pytest collects them in)."""
    found: set[Path] = set()
    for path in paths:
        if path.is_dir():
            found.update(p for p in path.rglob("*.md") if looks_like_guide(p))
        elif looks_like_guide(path):
            found.add(path)
    return sorted(found)


class GuideRegistry:
    """Guides of one session by id; a second guide with a known id is broken input."""

    def __init__(self, display: Callable[[Path], str] = relative_to_cwd) -> None:
        self.guides: dict[str, Guide] = {}
        self.display = display

    def add(self, guide: Guide) -> None:
        first = self.guides.get(guide.id)
        if first is not None and first.path != guide.path:
            raise GuideError.at(
                guide.path, guide.id_line, f"duplicate guide id `{guide.id}`, also used by {self.display(first.path)}",
                "give every guide its own id (by convention the file name without .md)",
            )  # fmt: skip
        self.guides[guide.id] = guide


def load_all(paths: Iterable[Path], checks: CheckFinder | None) -> tuple[list[Guide], list[GuideError]]:
    registry = GuideRegistry()
    guides: list[Guide] = []
    errors: list[GuideError] = []
    for path in discover(paths):
        try:
            guide = load_guide(path, checks)
            registry.add(guide)
        except GuideError as exc:
            errors.append(exc)
        else:
            guides.append(guide)
    return guides, errors


CHECKOUT_READINGS = Path(__file__).resolve().parents[2] / "readings"  # beside reader/ in a checkout (editable)


def find_readings(given: Path | None) -> Path | None:
    """The guides' directory: ``--readings`` when given; else ``./readings``; else the checkout's own, beside the
    ``reader`` package (an editable install, run from another directory). None when there is none: a wheel
    install ships no guides."""
    if given is not None:
        return given
    for candidate in (Path("readings"), CHECKOUT_READINGS):
        if candidate.is_dir():
            return candidate
    return None
