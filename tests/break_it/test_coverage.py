"""Every claim of every guide has at least one break-it test, and every break-it test names a real claim."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.break_it.conftest import guides

HERE = Path(__file__).parent


def _marked_claims() -> set[tuple[str, str]]:
    """(guide_id, claim_id) of every ``@pytest.mark.breaks("…", "…")`` in this folder, read from the source."""
    found = set()
    for path in HERE.glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "breaks"
                and len(node.args) == 2
                and all(isinstance(a, ast.Constant) for a in node.args)
            ):
                found.add((node.args[0].value, node.args[1].value))
    return found


def test_every_claim_has_a_break_it_test() -> None:
    claims = {(g.id, c.id) for g in guides().values() for c in g.claims}
    missing = sorted(claims - _marked_claims())
    assert not missing, "claims nobody has tried to break:\n" + "\n".join(f"  {g}::{c}" for g, c in missing)


def test_every_break_it_test_names_a_claim() -> None:
    claims = {(g.id, c.id) for g in guides().values() for c in g.claims}
    unknown = sorted(_marked_claims() - claims)
    assert not unknown, "break-it tests for claims no guide makes:\n" + "\n".join(f"  {g}::{c}" for g, c in unknown)
