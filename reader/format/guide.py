"""The guide model: front matter (anchors, claims) and the body split into regions.

Shaped like sybil: a document is a sequence of regions, each produced by the parser registered for its fence
kind (``reader.format.body``), with `Prose` between them. A region is any object with ``start``/``end`` lines (see
`Region`), so a new fence kind brings its own dataclass without touching this module. Everything carries the
1-based line of the ``.md`` file it came from, so errors and failures point there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from checks.expected import Expected


def version_admitted(spec: SpecifierSet, torch_version: str | None) -> bool:
    """Whether ``spec`` admits this torch (pre-releases and nightlies included; an unknown or unparseable version
    is admitted, so that it never hides drift)."""
    if torch_version is None:
        return True
    try:
        version = Version(torch_version)
    except InvalidVersion:
        return True
    return spec.contains(version, prereleases=True)


@dataclass(frozen=True)
class AnchorSpec:
    """A torch symbol the guide reads, optionally narrowed to one statement by an exact code pattern."""

    name: str  # short id used in item ids, the lock key and directives
    symbol: str  # "torch.distributed.fsdp._flat_param:FlatParamHandle.unshard"
    pattern: str | None
    line: int
    torch: SpecifierSet | None = None  # `torch = "<2.15"`: the releases that have this code; elsewhere not read

    def applies_to(self, torch_version: str | None) -> bool:
        return self.torch is None or version_admitted(self.torch, torch_version)

    @property
    def module(self) -> str:
        return self.symbol.partition(":")[0]

    @property
    def qualname(self) -> str:
        return self.symbol.partition(":")[2]


@dataclass(frozen=True)
class ExpectedFailure:
    """A claim torch is known to break today: its check must fail, and for one reason only. The day it passes
    (torch fixed the bug), a strict one fails as an unexpected pass, so the gate reports the fix."""

    reason: str  # one line: why it fails today
    issue: str  # the tracking issue's URL
    fails_with: str  # the `Violation` reason the check raises while the bug is there
    strict: bool = True


@dataclass(frozen=True)
class PropertySpec:
    """A claim checked over drawn examples: hypothesis draws from ``draw()`` in the pytest process and sends each
    example to the ranks as the check's ``example`` argument, shrinking a failure to a minimal example."""

    draw: str  # "checks.models.flat_param_draws:units", a zero-argument function returning a strategy
    examples: int


VIEWS = ("timeline", "memory", "layout")  # the views a claim's run can support (`ClaimSpec.views`)


@dataclass(frozen=True)
class ClaimSpec:
    """One sentence about behaviour and the check (run on the rank pool) that proves it."""

    id: str
    statement: str
    check: str  # "checks.guides.g04_forward_prefetch:no_prefetch_in_iteration_1"
    kwargs: Mapping[str, Any]
    world_size: int
    markers: tuple[str, ...]
    evidence: tuple[str, ...]  # anchor names; empty = every traceable anchor of the guide
    timeout: float | None
    line: int
    xfail: ExpectedFailure | None = None  # `xfail = { ... }`: the claim is expected to fail, for ``fails_with``
    property: PropertySpec | None = None  # `property = { draw, examples }`: checked over drawn examples
    torch: SpecifierSet | None = None  # the torch versions this claim describes, inside the guide's
    backends: tuple[str, ...] = ()  # `backend = "gloo"`: the backends its check is written for (empty: any)
    views: tuple[str, ...] = ()  # `views = ["timeline", "memory"]`: what fsdp-readings can draw from its run

    def applies_to(self, torch_version: str | None) -> bool:
        return self.torch is None or version_admitted(self.torch, torch_version)


@dataclass(frozen=True)
class Note:
    """An annotation pinned to the one place in an anchor's live code that ``pattern`` matches."""

    pattern: str
    text: str
    line: int
    torch: SpecifierSet | None = None  # `note "…" [torch >=2.15]: …`: the torch versions this note holds for

    def applies_to(self, torch_version: str | None) -> bool:
        return self.torch is None or version_admitted(self.torch, torch_version)


@runtime_checkable
class Region(Protocol):
    """A span of a guide's body, 1-based and inclusive: what a body parser yields (usually a frozen dataclass)."""

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...


R = TypeVar("R")


@dataclass(frozen=True)
class Prose:
    """Markdown between directives, kept verbatim for renderers."""

    start: int
    end: int
    text: str


@dataclass(frozen=True)
class SourceBlock:
    """A ```` ```source <anchor> ```` fence: quote the anchor's live code here, with these notes on it."""

    anchor: str
    notes: tuple[Note, ...]
    start: int  # the opening fence line
    end: int  # the closing fence line
    torch: SpecifierSet | None = None  # ```source <anchor> [torch >=2.15]: quoted only on these releases

    def notes_for(self, torch_version: str | None) -> tuple[Note, ...]:
        """The notes that hold for this torch: a note scoped to other versions is neither shown nor checked."""
        return tuple(n for n in self.notes if n.applies_to(torch_version))

    def applies_to(self, torch_version: str | None) -> bool:
        return self.torch is None or version_admitted(self.torch, torch_version)


@dataclass(frozen=True)
class ExpectBlock:
    """A ```` ```expect <name> <shape> ```` fence: data the prose states, rows of a shape, that a claim's check
    receives as its expected value (`expected`), so what the guide says and what is checked are one text."""

    name: str
    items: tuple[str, ...]  # the non-blank lines as written, less the block's indent: what a reader is shown
    start: int
    end: int
    torch: SpecifierSet | None = None  # ```expect <name> [torch >=2.15]: what a claim expects on these releases
    shape: str | None = None  # ```expect <name> <shape>: lines, pairs, mapping or table
    # The typed rows a claim's check receives; None only in a guide with problems, which never reaches a check.
    expected: Expected | None = field(default=None, compare=False)

    def applies_to(self, torch_version: str | None) -> bool:
        return self.torch is None or version_admitted(self.torch, torch_version)


class ExpectBlockUnavailable(ValueError):
    """A claim names an expect block that has no version for this torch, or more than one."""


BLOCK_REFERENCE = "expect"  # a kwarg written { expect = "<block name>" } receives that block's typed rows


def block_reference(value: Any) -> str | None:
    """The block name if ``value`` is a reference to an expect block, else None."""
    if isinstance(value, Mapping) and set(value) == {BLOCK_REFERENCE} and isinstance(value[BLOCK_REFERENCE], str):
        return value[BLOCK_REFERENCE]
    return None


@dataclass(frozen=True)
class Guide:
    path: Path
    id: str
    title: str
    order: int
    torch: SpecifierSet
    anchors: tuple[AnchorSpec, ...]
    claims: tuple[ClaimSpec, ...]
    regions: tuple[Region, ...] = field(default=())
    id_line: int = 1
    text: str = field(default="", repr=False, compare=False)  # the file as parsed, for `raw`
    read_on: str | None = None  # set by `on`: the torch version this view of the guide is for

    def anchor(self, name: str) -> AnchorSpec:
        for anchor in self.anchors:
            if anchor.name == name:
                return anchor
        raise KeyError(name)

    def regions_of(self, kind: type[R]) -> list[R]:
        """The regions of one type, in document order (``guide.regions_of(SourceBlock)``)."""
        return [r for r in self.regions if isinstance(r, kind)]

    def raw(self, region: Region) -> str:
        """The region's lines as written in the file: how a renderer shows a region type it does not know."""
        return "\n".join(self.text.split("\n")[region.start - 1 : region.end])

    def source_blocks(self, anchor_name: str | None = None) -> list[SourceBlock]:
        return [r for r in self.regions_of(SourceBlock) if anchor_name in (None, r.anchor)]

    def expect_blocks(self, torch_version: str | None = None) -> dict[str, ExpectBlock]:
        """Expect blocks by name: of a name written for several torch ranges, the one for ``torch_version``
        (`ExpectBlockUnavailable` when that is ambiguous: read the guide `on` one torch first)."""
        found: dict[str, ExpectBlock] = {}
        for block in self.regions_of(ExpectBlock):
            if not block.applies_to(torch_version):
                continue
            if block.name in found:
                first = found[block.name]
                where = f"on torch {torch_version}" if torch_version else "read on no torch in particular"
                raise ExpectBlockUnavailable(
                    f"{self.path}:{block.start}: expect block `{block.name}` holds for torch {block.torch or 'any'} "
                    f"and for torch {first.torch or 'any'} (line {first.start}); {where} both apply"
                )
            found[block.name] = block
        return found

    def claim_kwargs(self, claim: ClaimSpec) -> dict[str, Any]:
        """The claim's kwargs with every ``{ expect = "<name>" }`` replaced by that block's typed rows
        (`checks.expected.Expected`)."""
        blocks = self.expect_blocks(self.read_on)
        resolved = {}
        for key, value in claim.kwargs.items():
            name = block_reference(value)
            if name is not None and name not in blocks:
                raise ExpectBlockUnavailable(
                    f"{self.path}:{claim.line}: claim `{claim.id}` takes `{key}` from expect block `{name}`, which "
                    f"has no version for torch {self.read_on}: scope the claim (`torch = ...`) to the releases "
                    "the block holds for, or write the block for this torch too"
                )
            resolved[key] = blocks[name].expected if name is not None else value
        return resolved

    def on(self, torch_version: str | None) -> Guide:
        """The guide as read on ``torch_version``: anchors, source blocks, notes and expect blocks scoped to other
        releases left out. Claims stay (each is skipped where its own ``torch`` excludes it)."""
        anchors = tuple(a for a in self.anchors if a.applies_to(torch_version))
        names = {a.name for a in anchors}
        regions: list[Region] = []
        for region in self.regions:
            if isinstance(region, SourceBlock):
                if region.anchor in names and region.applies_to(torch_version):
                    regions.append(replace(region, notes=region.notes_for(torch_version)))
            elif not isinstance(region, ExpectBlock) or region.applies_to(torch_version):
                regions.append(region)
        return replace(self, anchors=anchors, regions=tuple(regions), read_on=torch_version)

    def claim(self, claim_id: str) -> ClaimSpec:
        for claim in self.claims:
            if claim.id == claim_id:
                return claim
        raise KeyError(f"{self.id} has no claim {claim_id!r}; it has {sorted(c.id for c in self.claims)}")

    def applies_to(self, torch_version: str | None) -> bool:
        """Whether the guide's ``torch`` specifier admits this version (pre-releases and nightlies
        included)."""
        return version_admitted(self.torch, torch_version)
