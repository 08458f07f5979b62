"""Every function and method of FSDP2's ``torch/distributed/fsdp/_fully_shard/`` is read by a guide, or listed with
its reason in ``readings/not-read/fully_shard.toml``.

A function is read when a guide anchors it (its own symbol, or a class or function whose span holds it) and the
guide reads it there: a note of that anchor lands inside the function, or the guide's prose or notes name it in
code (```name``` or ```Class.name```). An anchor nobody writes about does not count. Definitions come from the
installed torch's source (libcst), so a torch that adds a function fails here until a guide reads it or the list
names it; a listed name that a guide now reads, or that this torch does not define, fails too, unless its entry
is scoped to other releases.

The share read is held to a floor on torch 2.13.0, the leg the suite is approved on first; on other releases the
test reports the share and fails only on a function neither read nor listed. Later issues raise the floor.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from reader.format.guide import Guide, Prose
from reader.format.parse import load_guide, looks_like_guide
from reader.source.anchors import AnchorError, Resolver
from reader.source.index import IndexCache
from reader.source.torch_source import TorchSource, decode_source, open_source

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "torch.distributed.fsdp._fully_shard"
RELDIR = "torch/distributed/fsdp/_fully_shard"
LISTED = ROOT / "readings" / "not-read" / "fully_shard.toml"
FLOOR = 0.55  # share read on FLOOR_TORCH; raise it as guides read more
FLOOR_TORCH = "2.13.0"


@dataclass(frozen=True)
class Function:
    module: str  # "_fsdp_state"
    qualname: str  # "FSDPState._lazy_init"
    start: int
    end: int

    @property
    def name(self) -> str:
        return self.qualname.split(".")[-1]


@dataclass(frozen=True)
class Listing:
    reason: str
    torch: SpecifierSet | None  # the releases that define it; elsewhere the row is not stale


@dataclass(frozen=True)
class Gaps:
    unread: list[str]  # defined, neither read nor listed
    listed_but_read: list[str]
    listed_but_gone: list[str]
    listed_without_reason: list[str]


def functions(source: TorchSource) -> list[Function]:
    """Every function and method (nested ones too; an ``@overload`` stub counts with its implementation) of the
    package's modules, in file order."""
    cache, found = IndexCache(), []
    for name in source.list_dir(RELDIR):
        if not name.endswith(".py") or name == "__init__.py":
            continue
        data = source.read_bytes(f"{RELDIR}/{name}")
        assert data is not None
        index = cache.index(data, decode_source(data))
        for qualname, defs in index.definitions.items():
            kinds = [d for d in defs if d.kind == "function"]
            if kinds:
                found.append(Function(name[:-3], qualname, min(d.first for d in kinds), max(d.end for d in kinds)))
    return sorted(found, key=lambda f: (f.module, f.start))


def mentions(text: str) -> set[str]:
    """Identifiers a guide names in code: every dotted name inside a backtick span, and each of its parts."""
    named: set[str] = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        for dotted in re.findall(r"[A-Za-z_][\w.]*", span):
            parts = dotted.strip(".").split(".")
            named.update(parts)
            named.update(".".join(parts[i : i + 2]) for i in range(len(parts) - 1))
    return named


def read_by(guide: Guide, resolver: Resolver, defined: list[Function], version: str) -> set[Function]:
    """The functions ``guide`` (as read on ``version``) anchors and reads."""
    guide = guide.on(version)
    named = mentions("\n".join(r.text for r in guide.regions_of(Prose)))
    read: set[Function] = set()
    for anchor in guide.anchors:
        if anchor.torch is not None and not anchor.torch.contains(version, prereleases=True):
            continue
        module, _, qualname = anchor.symbol.partition(":")
        if not module.startswith(f"{PACKAGE}."):
            continue
        try:  # an overloaded name resolves only through its anchor's pattern
            whole = resolver.resolve(anchor.symbol, anchor.pattern) if anchor.pattern else resolver.resolve(
                anchor.symbol)  # fmt: skip
        except AnchorError:
            continue  # the anchor items report it
        first, last = whole.definition
        notes = [n for b in guide.source_blocks(anchor.name) for n in b.notes if n.applies_to(version)]
        noted = named | mentions("\n".join(n.text for n in notes))
        lines = [m.line for m in resolver.notes(whole, [n.pattern for n in notes]) if m.count == 1]
        for function in defined:
            if function.module != module.rsplit(".", 1)[1]:
                continue
            own = function.qualname == qualname  # an overloaded function spans its stubs too
            if not own and not first <= function.start <= last:
                continue
            spoken = function.name in noted or ".".join(function.qualname.split(".")[-2:]) in noted
            pinned = any(function.start <= line <= function.end for line in lines)
            if (own and lines) or spoken or pinned:
                read.add(function)
    return read


def listed(path: Path = LISTED) -> dict[str, Listing]:
    """``module:qualname`` → its listing, from the per-module tables of the TOML file."""
    rows: dict[str, Listing] = {}
    for module, entries in tomllib.loads(path.read_text(encoding="utf-8")).items():
        for qualname, entry in entries.items():
            if isinstance(entry, str):
                rows[f"{module}:{qualname}"] = Listing(entry, None)
            else:
                rows[f"{module}:{qualname}"] = Listing(entry.get("reason", ""), SpecifierSet(entry["torch"]))
    return rows


def gaps(defined: Iterable[str], read: set[str], rows: dict[str, Listing], version: str) -> Gaps:
    defined = list(defined)
    here = {key for key, row in rows.items() if row.torch is None or row.torch.contains(version, prereleases=True)}
    return Gaps(
        unread=[key for key in defined if key not in read and key not in rows],
        listed_but_read=sorted(here & read),
        listed_but_gone=sorted(here - set(defined)),
        listed_without_reason=sorted(key for key, row in rows.items() if not row.reason.strip()),
    )


def survey() -> tuple[str, list[Function], set[Function]]:
    """The installed torch's version, the package's functions and those the guides read."""
    source = open_source()
    try:
        version = (source.version or "").split("+")[0]
        defined = functions(source)
        resolver = Resolver(source)
        read: set[Function] = set()
        for path in sorted((ROOT / "readings").glob("*.md")):
            if looks_like_guide(path):
                guide = load_guide(path)
                if guide.torch.contains(version, prereleases=True):
                    read |= read_by(guide, resolver, defined, version)
    finally:
        source.close()
    return version, defined, read


def key(function: Function) -> str:
    return f"{function.module}:{function.qualname}"


@pytest.fixture(scope="module")
def surveyed() -> tuple[str, list[Function], set[Function]]:
    return survey()


def test_every_function_is_read_by_a_guide_or_listed_with_its_reason(surveyed) -> None:
    version, defined, read = surveyed
    found = gaps([key(f) for f in defined], {key(f) for f in read}, listed(), version)
    where = LISTED.relative_to(ROOT)
    assert not found.unread, (
        f"{len(found.unread)} of {len(defined)} functions of {RELDIR}/ on torch {version} are neither read by a "
        f"guide nor listed in {where}: {found.unread}. Anchor each in the guide that reads it (with a note or "
        f'prose naming it), or add `qualname = "why no guide reads it"` under its module\'s table.'
    )
    assert not found.listed_but_read, f"{where} lists as not read, but guides read: {found.listed_but_read}"
    assert not found.listed_but_gone, (
        f"{where} lists names torch {version} does not define: {found.listed_but_gone}; remove them, or scope the "
        'entry to the releases that have it: `name = { reason = "...", torch = ">=2.15" }`'
    )
    assert not found.listed_without_reason, f"{where} lists without a reason: {found.listed_without_reason}"


def test_the_share_read_holds_the_floor(surveyed, record_property) -> None:
    version, defined, read = surveyed
    share = len(read) / len(defined)
    per_module = {m: f"{sum(f.module == m for f in read)}/{sum(f.module == m for f in defined)}"
                  for m in sorted({f.module for f in defined})}  # fmt: skip
    record_property("fully_shard_read", f"{len(read)} of {len(defined)} ({share:.0%}): {per_module}")
    if Version(version) != Version(FLOOR_TORCH):
        pytest.skip(f"torch {version}: the guides read {len(read)} of {len(defined)} ({share:.0%}) {per_module}; "
                    f"the floor is held on {FLOOR_TORCH}")  # fmt: skip
    assert share >= FLOOR, (
        f"the guides read {len(read)} of the {len(defined)} functions of {RELDIR}/ ({share:.0%}), under the floor "
        f"of {FLOOR:.0%}: {per_module}"
    )


def test_the_count_in_readme_is_the_count_measured(surveyed) -> None:
    version, defined, read = surveyed
    if Version(version) != Version(FLOOR_TORCH):
        pytest.skip(f"README states the counts of torch {FLOOR_TORCH}; this is {version}")
    stated = f"the guides read {len(read)} of the {len(defined)} functions ({len(read) / len(defined):.0%})"
    assert stated in " ".join((ROOT / "README.md").read_text().split()), f"README.md should say: {stated!r}"
    for module in sorted({f.module for f in defined}):
        row = (f"| `{module}.py` | {sum(f.module == module for f in read)} | "
               f"{sum(f.module == module for f in defined)} |")  # fmt: skip
        assert row in (ROOT / "README.md").read_text(), f"README.md's table should have the row {row!r}"


# -- the coverage rule itself can fail -----------------------------------------------------------------------


def test_the_rule_finds_an_unread_function_and_stale_rows() -> None:
    rows = {
        "m:listed": Listing("runs only under torch.compile", None),
        "m:read": Listing("stale", None),
        "m:gone": Listing("removed", None),
        "m:later": Listing("2.15 adds it", SpecifierSet(">=2.15")),
        "m:bare": Listing("", None),
    }
    found = gaps(["m:read", "m:unread", "m:listed"], {"m:read"}, rows, "2.13.0")
    assert found == Gaps(
        unread=["m:unread"], listed_but_read=["m:read"], listed_but_gone=["m:bare", "m:gone"],
        listed_without_reason=["m:bare"],
    )  # fmt: skip
    assert gaps(["m:listed"], set(), {"m:later": rows["m:later"]}, "2.15.0").listed_but_gone == ["m:later"]


def test_a_name_counts_only_in_code() -> None:
    named = mentions("The root's `FSDPState._lazy_init` runs; unshard is prose, `pg.unshard(async_op)` code.")
    assert {"_lazy_init", "FSDPState._lazy_init", "unshard", "pg.unshard"} <= named
    assert "runs" not in named and "root" not in named
