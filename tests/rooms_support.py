"""What the two rooms tests share (``tests/reader/test_rooms.py`` for reader/, ``tests/test_check_rooms.py`` for
checks/): a breach with its place, the rooms a tree's ``__init__`` docstrings declare, and the copies the
break-it cases bend."""

from __future__ import annotations

import ast
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from graphlib import CycleError, TopologicalSorter
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


def module_name(tree: Path, path: Path) -> str:
    """``checks/probes/comm.py`` → ``checks.probes.comm``; a package's ``__init__`` is the package."""
    parts = path.relative_to(tree.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(tree: Path, path: Path) -> list[tuple[int, str]]:
    """(line, module) of each module of ``tree`` that ``path`` imports, wherever the import is written: ``from
    checks.probes import clock`` names the submodule ``checks.probes.clock`` when there is one, else the package
    (a name its ``__init__`` holds)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            targets = []
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                as_path = tree.parent.joinpath(*submodule.split("."))
                is_module = as_path.with_suffix(".py").is_file() or (as_path / "__init__.py").is_file()
                targets.append(submodule if is_module else node.module)
        else:
            continue
        found += [(node.lineno, target) for target in targets if target.split(".")[0] == tree.name]
    return found


def module_cycle(tree: Path, room_of: Callable[[str], str]) -> list[str] | None:
    """Modules of one room that import each other in a circle (the first found), or None: imports between rooms
    are the declarations' business, so only edges inside a room count."""
    graph: dict[str, set[str]] = {}
    for path in sorted(tree.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        module = module_name(tree, path)
        edges = graph.setdefault(module, set())
        edges.update(target for _, target in imports_of(tree, path) if room_of(target) == room_of(module))
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        return list(exc.args[1])
    return None
