"""What the two rooms tests share (``tests/reader/test_rooms.py`` for reader/, ``tests/test_check_rooms.py`` for
checks/): a breach with its place, the rooms a tree's ``__init__`` docstrings declare, and the copies the
break-it cases bend."""

from __future__ import annotations

import ast
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

MAY_IMPORT = re.compile(r"^May import: (?P<rooms>.+?)\.?$", re.M)


@dataclass(frozen=True)
class Breach:
    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def docstring(init: Path) -> str:
    return ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""


def declared_rooms(tree: Path) -> dict[str, frozenset[str]]:
    """Room → the rooms it may import, from each room's ``__init__`` docstring (``May import: a, b.``, or
    ``nothing else of <tree>``)."""
    rooms: dict[str, frozenset[str]] = {}
    for init in sorted(tree.glob("*/__init__.py")):
        found = MAY_IMPORT.search(docstring(init))
        if found is None:
            raise AssertionError(f"{init}: the docstring says no `May import: ...` line")
        text = found.group("rooms").strip()
        allowed = () if text == f"nothing else of {tree.name}" else (r.strip() for r in text.split(","))
        rooms[init.parent.name] = frozenset(allowed)
    return rooms


def copy_of(tree: Path, tmp_path: Path) -> Path:
    """A copy of ``tree`` (without caches) to bend."""
    copied = tmp_path / tree.name
    shutil.copytree(tree, copied, ignore=shutil.ignore_patterns("__pycache__"))
    return copied


def append(path: Path, text: str) -> int:
    """Append ``text`` to ``path``; the line it starts on."""
    before = path.read_text(encoding="utf-8")
    path.write_text(before + text, encoding="utf-8")
    return before.count("\n") + 1
