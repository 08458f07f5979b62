"""An anchor's approved sources, one per release where its code differs, and how approving one changes them.

`ApprovedSource` is one approved text, where it was read and the releases from which it holds; `LockEntry` an
anchor's sources, oldest first, with the timeline that says which one an approved release reads (`serving`);
`GuideRecord` what a guide's claims did on a release it was approved on. `approve` and `settle` are the
arithmetic of an approval: which source each approved release reads afterwards, changing ``approved_on`` only
where it must, so entries whose code did not change stay byte-identical in the lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TypeVar

from packaging.version import Version

from reader.gate.releases import release_or_unknown, version_key
from reader.source.fingerprint import Fingerprints, fingerprint

T = TypeVar("T")


@dataclass(frozen=True)
class ApprovedSource:
    """One approved text of an anchor, where it was read, and the releases from which it holds."""

    file: str  # relative to the directory holding torch/
    lines: tuple[int, int]
    source: str  # always ends with a newline
    approved_on: tuple[str, ...]  # canonical releases, oldest first

    def __post_init__(self) -> None:
        if not self.source.endswith("\n"):  # the lock stores lines; a final newline is implied
            object.__setattr__(self, "source", self.source + "\n")

    @cached_property
    def fingerprints(self) -> Fingerprints:
        """Computed from the text (cheap, and never stale: the lock stores no hashes to review)."""
        return fingerprint(self.source)

    @property
    def first(self) -> tuple[int, Version]:
        """Sort key: the oldest release it holds from."""
        return version_key(self.approved_on[0]) if self.approved_on else version_key("")


@dataclass(frozen=True)
class LockEntry:
    symbol: str
    pattern: str | None
    sources: tuple[ApprovedSource, ...]  # oldest first; never empty

    def serving(self, at: str) -> ApprovedSource | None:
        """The source an approved release reads: the one holding the newest ``approved_on`` at or below it."""
        return _newest_start(((start, s) for s in self.sources for start in s.approved_on), at)

    def for_version(self, torch_version: str | None) -> ApprovedSource:
        """What a run on ``torch_version`` is compared with when its code matches none of the sources: the one
        serving it, else the oldest (a version below all of them)."""
        found = self.serving(release_or_unknown(torch_version)) if torch_version else None
        return found or self.sources[0]

    @property
    def approved_on(self) -> tuple[str, ...]:
        return tuple(v for s in self.sources for v in s.approved_on)


@dataclass(frozen=True)
class GuideRecord:
    """What approving a guide on one release found of its claims (all of which ran, in that session)."""

    held: int | None  # claims that passed or failed as their xfail expects; None: approved before this was kept
    skipped: tuple[str, ...] = ()  # claims that did not apply there (other torch, backend, GPUs): ids
    failed: tuple[str, ...] = ()  # only with `forced`
    not_run: tuple[str, ...] = ()  # only with `forced`
    forced: str | None = None  # why a person approved anyway


def settle(
    symbol: str, pattern: str | None, sources: Iterable[ApprovedSource], served: Mapping[str, ApprovedSource]
) -> LockEntry:
    """The entry whose sources serve exactly ``served`` (release → the source it reads; each value is one of
    ``sources`` or a new one). ``approved_on`` lists change only where they must: a release that now reads
    another source leaves the one it read, and a release the timeline would give another source is added to
    its own. Sources that serve no release are dropped."""
    if not served:
        raise ValueError("an entry must serve at least one release")
    wanted = {id(s): s for s in served.values()}
    starts = {key: [r for r in s.approved_on if served.get(r, s) is s] for key, s in wanted.items()}
    for at in sorted(served, key=version_key):  # ascending: a start added here only moves later releases
        owner = _newest_start(((r, key) for key, rs in starts.items() for r in rs), at)
        if owner != id(served[at]):
            starts[id(served[at])].append(at)
    kept = [replace(s, approved_on=tuple(sorted(starts[k], key=version_key))) for k, s in wanted.items()]
    return LockEntry(symbol, pattern, tuple(sorted(kept, key=lambda s: s.first)))


def _newest_start(starts: Iterable[tuple[str, T]], at: str) -> T | None:
    """Of (release, value) pairs, the value of the newest release at or below ``at``."""
    best: tuple[tuple[int, Version], T] | None = None
    for start, value in starts:
        key = version_key(start)
        if key <= version_key(at) and (best is None or key > best[0]):
            best = (key, value)
    return best[1] if best else None


def approve(
    previous: LockEntry | None,
    *,
    symbol: str,
    pattern: str | None,
    file: str,
    lines: tuple[int, int],
    source: str,
    torch_version: str | None,
    keep: Iterable[str] = (),
) -> LockEntry:
    """The entry recording that a person approved ``source`` on ``torch_version``, still serving the releases of
    ``keep`` (a matrix's other approved releases) with the sources they read. Without ``keep`` it is the only
    source: identical text keeps its ``approved_on`` (and takes the new location), other text replaces it. With
    ``keep``, text identical or equal up to comments and formatting to a source already kept reuses it; other
    text is added."""
    at = release_or_unknown(torch_version)
    current = ApprovedSource(file, lines, source, (at,))
    same_anchor = previous is not None and (previous.symbol, previous.pattern) == (symbol, pattern)
    sources = list(previous.sources) if previous is not None and same_anchor else []
    served: dict[str, ApprovedSource] = {}
    if previous is not None and same_anchor:
        for other in keep:
            if other != at and (found := previous.serving(other)) is not None:
                served[other] = found
    exact = next((s for s in sources if s.fingerprints.exact == current.fingerprints.exact), None)
    # Equal up to comments and formatting: what drift calls cosmetic. Annotations count, as they do there (an
    # annotation-only change reused here would fail that release's anchor as "annotations-only" ever after).
    cosmetic = next((s for s in sources if s.fingerprints.cosmetic_to(current.fingerprints)), None)
    if served:
        chosen = exact or cosmetic or current
    elif exact is not None:
        chosen = replace(exact, file=file, lines=lines)
    else:
        chosen = current
    served[at] = chosen
    return settle(symbol, pattern, [*sources, chosen], served)
