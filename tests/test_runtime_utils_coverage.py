"""Every top-level function and class of FSDP1's `_runtime_utils.py` is read by a guide, or listed as not read.

The list of definitions comes from the installed torch's source, so a torch that adds a function fails here until
a guide anchors it or README's table "What the guides do not read" names it with its reason. A listed name that a
guide now anchors, or that torch no longer defines, fails too: the table stays true.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import libcst as cst
import pytest

from reader.format.parse import load_guide, looks_like_guide
from reader.source.torch_source import open_source

ROOT = Path(__file__).resolve().parents[1]
MODULE = "torch.distributed.fsdp._runtime_utils"
RELPATH = "torch/distributed/fsdp/_runtime_utils.py"
TABLE_HEADING = "### What the guides do not read in `_runtime_utils.py`"
ROW = re.compile(r"^\|\s*`(?P<name>[A-Za-z_]\w*)`\s*\|\s*(?P<reason>.*?)\s*\|\s*$")


@dataclass(frozen=True)
class Gaps:
    unread: list[str]  # defined, neither anchored nor listed
    listed_but_anchored: list[str]
    listed_but_gone: list[str]
    listed_without_reason: list[str]


def top_level_definitions(source: str) -> list[str]:
    """The functions and classes defined at module level, decorated or not, in source order."""
    body = cst.parse_module(source).body
    return [node.name.value for node in body if isinstance(node, (cst.FunctionDef, cst.ClassDef))]


def anchored_names(guide_paths: list[Path], module: str = MODULE) -> dict[str, list[str]]:
    """Top-level name in ``module`` → the guides that anchor it (``Class.method`` counts for ``Class``)."""
    found: dict[str, list[str]] = {}
    for path in guide_paths:
        guide = load_guide(path)
        for anchor in guide.anchors:
            where, _, qualname = anchor.symbol.partition(":")
            if where == module:
                found.setdefault(qualname.split(".")[0], []).append(guide.id)
    return found


def evidence_names(guide_paths: list[Path], module: str = MODULE) -> set[str]:
    """Top-level names that some claim lists in its ``evidence``: its pass requires that code to have run."""
    names: set[str] = set()
    for path in guide_paths:
        guide = load_guide(path)
        symbols = {a.name: a.symbol for a in guide.anchors}
        for claim in guide.claims:
            for anchor in claim.evidence:
                where, _, qualname = symbols[anchor].partition(":")
                if where == module:
                    names.add(qualname.split(".")[0])
    return names


def not_read_table(readme: str) -> dict[str, str]:
    """README's table under `TABLE_HEADING`: name → reason."""
    lines = readme.splitlines()
    try:
        start = lines.index(TABLE_HEADING)
    except ValueError:
        pytest.fail(f"README.md has no section {TABLE_HEADING!r}")
    rows: dict[str, str] = {}
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        if match := ROW.match(line):
            rows[match["name"]] = match["reason"]
    return rows


def gaps(defined: list[str], anchored: set[str], listed: dict[str, str]) -> Gaps:
    return Gaps(
        unread=[name for name in defined if name not in anchored and name not in listed],
        listed_but_anchored=sorted(set(listed) & anchored),
        listed_but_gone=sorted(set(listed) - set(defined)),
        listed_without_reason=sorted(name for name, reason in listed.items() if not reason),
    )


def guide_paths() -> list[Path]:
    return [p for p in sorted((ROOT / "readings").glob("*.md")) if looks_like_guide(p)]


def installed_runtime_utils() -> str:
    source = open_source()
    try:
        text = source.read_text(RELPATH)
    finally:
        source.close()
    assert text is not None, f"{RELPATH} is not in the installed torch"
    return text


def test_every_definition_is_read_by_a_guide_or_listed_with_its_reason() -> None:
    defined = top_level_definitions(installed_runtime_utils())
    anchored = anchored_names(guide_paths())
    found = gaps(defined, set(anchored), not_read_table((ROOT / "README.md").read_text()))
    assert not found.unread, (
        f"{len(found.unread)} of {len(defined)} top-level definitions of {RELPATH} are neither anchored by a guide "
        f"nor listed in README.md under {TABLE_HEADING!r}: {found.unread}. Anchor each in the guide that reads "
        "it, or add a row `| `name` | why no guide reads it |`."
    )
    assert not found.listed_but_anchored, f"README lists as not read, but guides anchor: {found.listed_but_anchored}"
    assert not found.listed_but_gone, f"README lists names this torch does not define: {found.listed_but_gone}"
    assert not found.listed_without_reason, f"README lists without a reason: {found.listed_without_reason}"


def test_the_count_in_readme_is_the_count_measured() -> None:
    """README states how many definitions the guides anchor and how many a claim names as evidence."""
    defined = top_level_definitions(installed_runtime_utils())
    paths = guide_paths()
    anchored = set(anchored_names(paths)) & set(defined)
    asserted = evidence_names(paths) & anchored
    stated = f"{len(anchored)} of its {len(defined)} top-level definitions; {len(asserted)} of them"
    assert stated in (ROOT / "README.md").read_text(), f"README.md should say: {stated!r}"


# -- the coverage rule itself can fail -----------------------------------------------------------------------
SYNTHETIC = """
@no_type_check
def _read(state): ...
class _Mode(Enum): ...
def _unread(): ...
def _listed(): ...
X = 1
"""


def test_the_rule_finds_an_unread_definition_and_stale_rows() -> None:
    defined = top_level_definitions(SYNTHETIC)
    assert defined == ["_read", "_Mode", "_unread", "_listed"]  # decorated ones too; assignments are not defs
    listed = {"_listed": "runs only under torch.compile", "_read": "stale", "_gone": "removed", "_bare": ""}
    found = gaps(defined, {"_read", "_Mode"}, listed)
    assert found == Gaps(
        unread=["_unread"], listed_but_anchored=["_read"], listed_but_gone=["_bare", "_gone"],
        listed_without_reason=["_bare"],
    )  # fmt: skip


def test_the_table_is_read_from_its_section_only() -> None:
    section = "\n| name | why |\n|---|---|\n| `_b` | a reason |\n"
    readme = f"# x\n| `_a` | elsewhere |\n{TABLE_HEADING}\n{section}## next\n| `_c` | x |"
    assert not_read_table(readme) == {"_b": "a reason"}
