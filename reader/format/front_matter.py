"""A guide's TOML front matter (between ``+++`` lines) → a `Guide` without its body regions.

Every problem is collected (not just the first) and pinned to a line of the ``.md`` file (through
``reader.format.toml_fields``): an author fixes a guide in one pass, not one error per run. Only front matter that
cannot be read at all (missing, never closed, not TOML) stops at once.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from reader.format.errors import GuideError, Problems
from reader.format.guide import Guide
from reader.format.specs import anchor_specs, claim_specs
from reader.format.toml_fields import Fields, TomlLines, toml_error_line, toml_error_message, type_name
from reader.source.checkref import CheckFinder

FENCE = "+++"
ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")

TOP_KEYS = ("id", "title", "order", "torch", "anchors", "claims")


@dataclass(frozen=True)
class FrontMatter:
    guide: Guide  # no regions yet: the body is parsed after
    declared: frozenset[str]  # every anchor name written, valid or not: one bad symbol must not cascade
    close: int  # index (0-based) of the closing ``+++`` line; the body starts after it


def read_front_matter(lines: list[str], path: Path, problems: Problems, checks: CheckFinder | None) -> FrontMatter:
    """The front matter of a guide split into ``lines``. Raises `GuideError` when there is none to read;
    every other problem is added to ``problems``."""
    if lines[0].strip() != FENCE:
        raise GuideError.at(
            path, 1, "no TOML front matter",
            "start the file with a line `+++`, the TOML front matter (id, title, order, torch, [[anchors]], "
            "[[claims]]), and another line `+++`",
        )  # fmt: skip
    close = next((i for i in range(1, len(lines)) if lines[i].strip() == FENCE), None)
    if close is None:
        raise GuideError.at(
            path, 1, "the front matter opened on line 1 is never closed",
            "add a line `+++` after the last front-matter line",
        )  # fmt: skip
    front = lines[1:close]
    try:
        data = tomllib.loads("\n".join(front))
    except tomllib.TOMLDecodeError as exc:
        raise GuideError.at(
            path, 1 + toml_error_line(exc), f"malformed TOML front matter: {toml_error_message(exc)}",
            "fix the TOML near this line: strings need quotes, tables are written [[anchors]] and [[claims]], "
            "each key appears once per table",
        ) from exc  # fmt: skip
    fields = Fields(problems, TomlLines(front, first_line=2))
    guide = _top_level(fields, data, path)
    anchors, declared = anchor_specs(fields, data.get("anchors", []))
    claims = claim_specs(fields, data.get("claims", []), anchors, declared, checks)
    return FrontMatter(replace(guide, anchors=tuple(anchors), claims=tuple(claims)), frozenset(declared), close)


def _top_level(fields: Fields, data: dict[str, Any], path: Path) -> Guide:
    """The guide's own keys (id, title, order, torch); its anchors and claims are filled in by the caller."""
    fields.unknown_keys(data, TOP_KEYS, (), "front matter")
    gid = fields.string(data, "id", (), f'id = "{path.stem}"', (ID_RE, "lowercase letters, digits, `-`, `.`, `_`"))
    title = fields.string(data, "title", (), 'title = "What this guide reads"')
    order = data.get("order")
    if order is None:
        fields.add(("order",), "missing `order`", "add `order = <n>`, the guide's place in the reading sequence")
    elif type(order) is not int:
        fields.add(("order",), f"`order` must be an integer, not {type_name(order)}", "write `order = 4`")
    spec_text = fields.string(data, "torch", (), 'torch = ">=2.13"')
    spec = SpecifierSet()
    if spec_text is not None:
        try:
            spec = SpecifierSet(spec_text)
        except InvalidSpecifier:
            fields.add(
                ("torch",),
                f'`torch = "{spec_text}"` is not a PEP 440 version specifier',
                'write a specifier such as `torch = ">=2.13"` or `torch = ">=2.13,<2.16"`',
            )
    return Guide(
        path=path,
        id=gid or "",
        title=title or "",
        order=order if type(order) is int else 0,
        torch=spec,
        anchors=(),
        claims=(),
        id_line=fields.line("id"),
    )
