"""checks/ is rooms too: each room imports only the rooms its ``__init__`` says, no guide imports another guide,
no room's modules import each other in a circle, and each room's map names every module it holds.

Each room's ``__init__`` docstring has a line ``May import: a, b.`` (or ``nothing else of checks``); the modules on
checks/'s own floor (`FLOOR`: one vocabulary, one way to fail, the typed expect rows) may be imported by every
room and import no room. Every import counts, wherever it is written (inside a function too). The same test
that guards reader/ (``tests/reader/test_rooms.py``) reads its rules from the docstrings a reader sees.
"""

from __future__ import annotations

import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

from tests.rooms_support import (
    Breach,
    append,
    copy_of,
    declared_rooms,
    docstring,
    imports_of,
    module_cycle,
    module_name,
)

REPO = Path(__file__).resolve().parents[1]
FLOOR = {"naming", "numerics", "violation", "expected"}  # checks/*.py: importable from every room
GUIDE = re.compile(r"^g\d\d_\w+$")


def _room_and_guide(module: str) -> tuple[str, str | None]:
    """``checks.guides.g20_auto_wrap.fsdp2`` → ("guides", "g20_auto_wrap"); ``checks.naming`` → ("naming", None)."""
    parts = module.split(".")
    room = parts[1] if len(parts) > 1 else ""
    guide = parts[2] if room == "guides" and len(parts) > 2 and GUIDE.match(parts[2]) else None
    return room, guide


def _map_names(checks: Path, package: Path) -> list[Breach]:
    """A package's ``__init__`` names each module and subpackage it holds (as `` `name` ``)."""
    text = docstring(package / "__init__.py")
    held = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    held += sorted(p.name for p in package.iterdir() if (p / "__init__.py").is_file())
    return [
        Breach(package / "__init__.py", 1, f"the map does not name `{name}`")
        for name in held
        if f"`{name}`" not in text and f"`{module_name(checks, package)}.{name}`" not in text
    ]


def breaches(checks: Path) -> list[Breach]:
    rooms = declared_rooms(checks)
    found: list[Breach] = []
    for room, allowed in rooms.items():
        for unknown in sorted(allowed - set(rooms)):
            found.append(Breach(checks / room / "__init__.py", 1, f"`{room}` may import `{unknown}`: no such room"))
    try:
        TopologicalSorter({room: allowed & set(rooms) for room, allowed in rooms.items()}).prepare()
    except CycleError as exc:
        found.append(Breach(checks, 1, f"the rooms' declarations form a cycle: {' -> '.join(exc.args[1])}"))
    for top in sorted(checks.glob("*.py")):
        if top.stem not in FLOOR | {"__init__"}:
            found.append(Breach(top, 1, f"a module on checks/'s floor: put `{top.stem}` in a room"))
    for path in sorted(checks.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        module = module_name(checks, path)
        room, guide = _room_and_guide(module)
        for line, target in imports_of(checks, path):
            target_room, target_guide = _room_and_guide(target)
            if target_room == room:
                if guide is not None and target_guide is not None and target_guide != guide:
                    found.append(Breach(path, line, f"imports {target}: a guide imports no other guide; move what "
                                                    "both use down to workloads, probes or models"))  # fmt: skip
            elif room in FLOOR and target_room not in FLOOR:
                found.append(Breach(path, line, f"imports {target}: a floor module imports no room"))
            elif room in rooms and target_room not in FLOOR | rooms[room]:
                may = ", ".join(sorted(rooms[room])) or "nothing else of checks"
                found.append(Breach(path, line, f"imports {target}: `{room}` may import {may}"))
    if cycle := module_cycle(checks, lambda module: _room_and_guide(module)[0]):
        found.append(Breach(checks, 1, f"modules import each other in a circle: {' -> '.join(cycle)}"))
    for package in sorted({p.parent for p in checks.rglob("__init__.py")} - {checks}):
        if "__pycache__" not in package.parts:
            found += _map_names(checks, package)
    return found


def test_the_check_rooms_keep_their_import_direction_and_their_maps() -> None:
    assert [str(b) for b in breaches(REPO / "checks")] == []


@pytest.fixture
def copy_of_checks(tmp_path: Path) -> Path:
    return copy_of(REPO / "checks", tmp_path)


def test_a_guide_importing_another_guide_is_caught(copy_of_checks: Path) -> None:
    g04 = copy_of_checks / "guides" / "g04_forward_prefetch.py"
    line = append(g04, "\n\ndef _late() -> None:\n    from checks.guides.g03_unshard_reshard import fsdp1_gpt\n") + 3
    assert [str(b) for b in breaches(copy_of_checks)] == [
        f"{g04}:{line}: imports checks.guides.g03_unshard_reshard: a guide imports no other guide; move what both "
        "use down to workloads, probes or models"
    ]


def test_a_room_importing_against_its_direction_is_caught(copy_of_checks: Path) -> None:
    clock = copy_of_checks / "probes" / "clock.py"
    line = append(clock, "from checks.workloads.gpt import batch\n")
    naming = copy_of_checks / "naming.py"
    floor = append(naming, "import checks.ranks.context\n")
    assert [str(b) for b in breaches(copy_of_checks)] == [
        f"{naming}:{floor}: imports checks.ranks.context: a floor module imports no room",
        f"{clock}:{line}: imports checks.workloads.gpt: `probes` may import ranks",
    ]


def test_modules_of_a_room_importing_each_other_in_a_circle_are_caught(copy_of_checks: Path) -> None:
    append(copy_of_checks / "probes" / "clock.py", "from checks.probes import comm\n")  # comm imports clock
    (found,) = breaches(copy_of_checks)
    assert found.message.startswith("modules import each other in a circle: ")
    assert {"checks.probes.clock", "checks.probes.comm"} <= set(found.message.split(": ")[1].split(" -> "))


def test_a_cycle_of_declarations_and_a_module_the_map_does_not_name_are_caught(copy_of_checks: Path) -> None:
    init = copy_of_checks / "ranks" / "__init__.py"
    init.write_text(
        init.read_text(encoding="utf-8").replace("May import: nothing else of checks.", "May import: probes.")
    )
    (copy_of_checks / "models" / "stray_rule.py").write_text('"""A rule nobody mapped."""\n')
    found = [str(b) for b in breaches(copy_of_checks)]
    assert found[0].endswith("the rooms' declarations form a cycle: probes -> ranks -> probes") or found[0].endswith(
        "the rooms' declarations form a cycle: ranks -> probes -> ranks"
    )
    assert found[1:] == [f"{copy_of_checks / 'models' / '__init__.py'}:1: the map does not name `stray_rule`"]
