"""reader/ is rooms, and each room imports only the rooms below it.

Each room's ``__init__`` docstring ends with ``May import: a, b.`` (or ``nothing else of reader``); this test reads
those lines, so the rule a reader sees and the rule enforced are one text. Every import counts, wherever it is
written: at module level, inside a function (the lazy imports of the commands), or under ``TYPE_CHECKING``; and
the modules of one room import each other in no circle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

from tests.rooms_support import Breach, append, copy_of, declared_rooms, module_cycle

REPO = Path(__file__).resolve().parents[2]
ENTRY_POINTS = {"__init__", "__main__", "cli", "plugin"}  # the only modules reader/ keeps at its top level
MAX_ROOM_MODULES = 12


def imported_rooms(path: Path, rooms: set[str]) -> list[tuple[int, str, str]]:
    """(line, the module as written, the room it is in or the entry point it names) for each reader import."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # ``from reader import gate`` names the room in the alias
            modules = [f"{node.module}.{a.name}" for a in node.names] if node.module == "reader" else [node.module]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] == "reader" and len(parts) > 1:
                found.append((node.lineno, module, parts[1]))
    return found


def breaches(reader: Path) -> list[Breach]:
    """Every way ``reader`` breaks its rooms: a lower room importing a higher one (or an entry point), a room
    without a declaration, a room that declares what does not exist, a cycle of declarations or of a room's own
    modules, or a crowded floor."""
    rooms = declared_rooms(reader)
    found: list[Breach] = []
    for room, allowed in rooms.items():
        for unknown in sorted(allowed - set(rooms)):
            found.append(Breach(reader / room / "__init__.py", 1, f"`{room}` may import `{unknown}`: no such room"))
    try:
        TopologicalSorter({room: allowed & set(rooms) for room, allowed in rooms.items()}).prepare()
    except CycleError as exc:
        found.append(Breach(reader, 1, f"the rooms' declarations form a cycle: {' -> '.join(exc.args[1])}"))
    for top in sorted(reader.glob("*.py")):
        if top.stem not in ENTRY_POINTS:
            found.append(Breach(top, 1, f"a module on reader/'s floor: put `{top.stem}` in a room"))
    for package in sorted(p for p in reader.iterdir() if p.is_dir() and p.name != "__pycache__"):
        if package.name not in rooms:
            found.append(Breach(package, 1, f"`{package.name}` is a package with no `__init__` declaration"))
            continue
        modules = sorted(package.glob("*.py"))
        if len(modules) - 1 > MAX_ROOM_MODULES:
            found.append(Breach(package, 1, f"room `{package.name}` has {len(modules) - 1} modules"))
        for module in modules:
            for line, name, target in imported_rooms(module, set(rooms)):
                if target == package.name:
                    continue
                if target not in rooms:
                    what = "an entry point" if target in ENTRY_POINTS else "no room"
                    found.append(Breach(module, line, f"imports {name}: {what}; import the room that holds it"))
                elif target not in rooms[package.name]:
                    may = ", ".join(sorted(rooms[package.name])) or "nothing else of reader"
                    found.append(Breach(module, line, f"imports {name}: `{package.name}` may import {may}"))
    if cycle := module_cycle(reader, lambda module: module.split(".")[1] if "." in module else module):
        found.append(Breach(reader, 1, f"modules import each other in a circle: {' -> '.join(cycle)}"))
    return found


def test_the_rooms_keep_their_import_direction() -> None:
    assert [str(b) for b in breaches(REPO / "reader")] == []


@pytest.fixture
def copy_of_reader(tmp_path: Path) -> Path:
    return copy_of(REPO / "reader", tmp_path)


def test_a_lower_room_importing_a_higher_one_is_caught(copy_of_reader: Path) -> None:
    guide = copy_of_reader / "format" / "guide.py"
    line = append(guide, "from reader.claims.verdict import decide\n")
    anchors = copy_of_reader / "source" / "anchors.py"
    lazy = append(anchors, "\n\ndef _late() -> None:\n    import reader.gate.lock\n") + 3
    assert [str(b) for b in breaches(copy_of_reader)] == [
        f"{guide}:{line}: imports reader.claims.verdict: `format` may import source",
        f"{anchors}:{lazy}: imports reader.gate.lock: `source` may import nothing else of reader",
    ]


def test_a_room_importing_an_entry_point_or_a_sibling_it_does_not_declare_is_caught(copy_of_reader: Path) -> None:
    items = copy_of_reader / "pytest_plugin" / "items.py"
    entry = append(items, "from reader.plugin import claim_request\n")
    guide_view = copy_of_reader / "views" / "guide.py"
    sibling = append(guide_view, "from reader import pytest_plugin\n")
    assert [str(b) for b in breaches(copy_of_reader)] == [
        f"{items}:{entry}: imports reader.plugin: an entry point; import the room that holds it",
        f"{guide_view}:{sibling}: imports reader.pytest_plugin: `views` may import claims, format, gate, source",
    ]


def test_a_cycle_a_missing_declaration_and_a_crowded_floor_are_caught(copy_of_reader: Path) -> None:
    init = copy_of_reader / "source" / "__init__.py"
    init.write_text(
        init.read_text(encoding="utf-8").replace("May import: nothing else of reader.", "May import: gate.")
    )
    (copy_of_reader / "stray.py").write_text("")
    (copy_of_reader / "extra").mkdir()
    (copy_of_reader / "extra" / "__init__.py").write_text('"""A room that says nothing about its imports."""\n')
    with pytest.raises(AssertionError, match=r"extra/__init__.py: the docstring says no `May import"):
        breaches(copy_of_reader)
    (copy_of_reader / "extra" / "__init__.py").write_text('"""Extra.\n\nMay import: source.\n"""\n')
    found = [b.message for b in breaches(copy_of_reader)]
    cycle = [m for m in found if m.startswith("the rooms' declarations form a cycle: ")]
    assert len(cycle) == 1 and {"source", "gate"} <= set(cycle[0].split(": ")[1].split(" -> ")), found
    assert [m for m in found if m not in cycle] == ["a module on reader/'s floor: put `stray` in a room"]


def test_reader_keeps_four_modules_on_its_floor_and_small_rooms() -> None:
    reader = REPO / "reader"
    assert {p.stem for p in reader.glob("*.py")} == ENTRY_POINTS
    sizes = {room: len(list((reader / room).glob("*.py"))) - 1 for room in declared_rooms(reader)}
    assert max(sizes.values()) <= MAX_ROOM_MODULES, sizes


def test_the_entry_points_stay_where_they_were() -> None:
    """``fsdp-readings`` is ``reader.cli:main``, conftest names ``reader.plugin``, ``python -m reader`` runs."""
    from reader import cli, plugin
    from reader.commands import app
    from reader.pytest_plugin import hooks

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts == {"fsdp-readings": "reader.cli:main"}
    assert cli.main is app.main
    assert "reader.plugin" in (REPO / "conftest.py").read_text(encoding="utf-8")
    assert plugin.pytest_plugins == ["reader.pytest_plugin.hooks"] and plugin.claim_request is hooks.claim_request
    ran = subprocess.run(
        [sys.executable, "-m", "reader", "--help"], capture_output=True, text=True, cwd=REPO, check=False
    )
    assert ran.returncode == 0 and "fsdp-readings" in ran.stdout, ran.stderr


def test_modules_of_a_room_importing_each_other_in_a_circle_are_caught(copy_of_reader: Path) -> None:
    approving = copy_of_reader / "pytest_plugin" / "approving.py"
    append(
        approving, "\n\ndef _late() -> None:\n    from reader.pytest_plugin.items import GuideItem\n"
    )  # items import it
    (found,) = breaches(copy_of_reader)
    assert found.message.startswith("modules import each other in a circle: ")
    circle = set(found.message.split(": ", 1)[1].split(" -> "))
    assert {"reader.pytest_plugin.approving", "reader.pytest_plugin.items"} <= circle
