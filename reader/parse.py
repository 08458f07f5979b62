"""Parse a guide file: TOML front matter between ``+++`` lines, then the Markdown body split into regions.

The entry point; the work is done by ``reader.front_matter`` (the front matter → a `Guide`, with
``reader.specs`` for its anchors and claims) and ``reader.body`` (the body → regions, by the parser registered
for each fence kind; ``reader.blocks`` registers ```` ```source ```` and ```` ```expect ````). Every problem
of a guide is collected, not just the first, and raised together as one `GuideError`.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import reader.predict  # noqa: F401  (registers the ```predict parser)
from reader.blocks import check_block_references  # importing it registers the built-in body parsers
from reader.body import BODY_PARSERS, BodyContext
from reader.checkref import CheckFinder
from reader.errors import GuideError, Problems
from reader.front_matter import FENCE, read_front_matter
from reader.guide import Guide

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
