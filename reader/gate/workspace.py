"""The engine the pytest plugin and the CLI share: guides + a torch source + the lock → drift, approvals.

One ``Workspace`` per session. It resolves each (symbol, pattern) once, reads the lock lazily (so a session
that collects no guide never touches it), and holds approvals in memory until ``save`` writes them in one
atomic write. It reads each guide as it is on its torch (`Guide.on`): an anchor, block or note scoped to other
releases is neither resolved, compared, checked nor approved here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from reader.format.guide import AnchorSpec, Guide
from reader.gate.approval import NotApprovable, claims_record
from reader.gate.drift import Drift, DriftKind, classify, other_torch
from reader.gate.lock import ApprovedSource, GuideRecord, Lock, approve, settle
from reader.gate.releases import UNKNOWN, release, release_or_unknown, sorted_releases
from reader.source.anchors import AnchorError, Resolution, Resolver
from reader.source.files import relative_to_cwd
from reader.source.index import IndexCache
from reader.source.torch_source import TorchSource

if TYPE_CHECKING:
    from reader.claims.verdict import ClaimVerdict

LOCK_NAME = "anchors.lock"


@dataclass(frozen=True)
class Approval:
    drift: Drift  # what the anchor looked like against the lock before approval
    source: ApprovedSource  # the source approved (one of the entry's sources when the lock keeps a matrix)


@dataclass(frozen=True)
class GuideApproval:
    """A guide approved on one release: its anchors, what its claims did, and the stale entries it dropped."""

    guide_id: str
    release: str
    record: GuideRecord
    anchors: list[Approval]
    pruned: list[str]


@dataclass
class Workspace:
    source: TorchSource
    lock_path: Path
    cache: IndexCache = field(default_factory=IndexCache)
    display: Callable[[Path], str] = relative_to_cwd  # how guide paths appear in messages

    def __post_init__(self) -> None:
        self.resolver = Resolver(self.source, self.cache)
        self._lock: Lock | None = None
        self.approvals: list[Approval] = []
        self._dirty = False

    @property
    def lock(self) -> Lock:
        """The lock (``LockError`` if malformed: broken input, reported as such)."""
        if self._lock is None:
            self._lock = Lock.load(self.lock_path)
        return self._lock

    @property
    def torch_version(self) -> str | None:
        return self.source.version

    def current(self, anchor: AnchorSpec) -> Resolution | AnchorError:
        try:
            return self.resolver.resolve(anchor.symbol, anchor.pattern)
        except AnchorError as exc:
            return exc

    @property
    def release(self) -> str:
        """This torch's canonical release (``unknown`` when its version cannot be read)."""
        return release_or_unknown(self.torch_version)

    def resolutions(self, guide: Guide) -> tuple[dict[str, Resolution], dict[str, AnchorError]]:
        """The guide's anchors on this torch, resolved or not; anchors scoped to other releases are in neither."""
        ok: dict[str, Resolution] = {}
        failed: dict[str, AnchorError] = {}
        for anchor in guide.on(self.torch_version).anchors:
            found = self.current(anchor)
            if isinstance(found, AnchorError):
                failed[anchor.name] = found
            else:
                ok[anchor.name] = found
        return ok, failed

    def drift(self, guide: Guide, anchor: AnchorSpec) -> Drift:
        if not anchor.applies_to(self.torch_version):
            return other_torch(guide.id, anchor, self.torch_version)
        current = self.current(anchor)
        found = classify(
            guide.id,
            anchor,
            approved=self.lock.get(guide.id, anchor.name),
            current=current,
            current_version=self.torch_version,
        )
        if found.current is not None:
            found.problems = self.note_problems(guide, anchor, found.current)
            if found.problems and found.ok:
                found.kind = DriftKind.PATTERN_LOST
                found.summary = "a note of the guide no longer lands on exactly one place in the code"
        return found

    def note_problems(self, guide: Guide, anchor: AnchorSpec, resolution: Resolution) -> list[str]:
        problems = []
        for block in guide.on(self.torch_version).source_blocks(anchor.name):
            notes = block.notes
            matches = self.resolver.notes(resolution, [n.pattern for n in notes])
            for note, match in zip(notes, matches, strict=True):
                if match.count != 1:
                    times = "nowhere" if match.count == 0 else f"{match.count} times"
                    where = f"{self.display(guide.path)}:{note.line}"
                    problems.append(
                        f"{where}: note pattern `{note.pattern}` matches {times} in `{anchor.name}` "
                        f"({resolution.span()}); re-read the code and repin the note"
                    )
        return problems

    def pending(self, guide: Guide) -> list[Drift]:
        """The guide's anchors on this torch that do not pass against the lock: what approving it would record."""
        found = (self.drift(guide, anchor) for anchor in guide.anchors)
        return [drift for drift in found if not drift.ok]

    def check_approvable(self, guide: Guide) -> list[Drift]:
        """The guide's anchors on this torch, or `NotApprovable` for what no claim or ``--force`` changes: a torch of
        unknown version or outside the lock's matrix, anchors that cannot be pinned (removed, a lost pattern or
        note). Front ends ask before they spend time running claims."""
        at = self.release
        if at == UNKNOWN:
            raise NotApprovable(guide.id, [f"this torch's version cannot be read ({self.source.describe()})"])
        matrix = self.lock.matrix
        if matrix and at not in matrix:
            raise NotApprovable(
                guide.id,
                [f"torch {at} is not a release of the lock's matrix ({', '.join(matrix)}): approve on one of them, "
                 f"or add it: fsdp-readings approve --matrix {','.join(sorted_releases({*matrix, at}))} {guide.id}"],
            )  # fmt: skip
        drifts = [self.drift(guide, anchor) for anchor in guide.anchors]
        unpinnable = [d for d in drifts if d.kind is not DriftKind.OTHER_TORCH and (d.current is None or d.problems)]
        if unpinnable:
            reasons = [f"{d.key}: {d.kind.value}: {_reason(d)}" for d in unpinnable]
            raise NotApprovable(guide.id, reasons, drifts=unpinnable)
        return drifts

    def approve_guide(
        self, guide: Guide, claims: Mapping[str, ClaimVerdict], *, force: str | None = None
    ) -> GuideApproval:
        """Record the guide's anchors as read on this torch, with what its claims did here (``claims``: each claim
        of this session, by id). All or nothing: `NotApprovable` names every reason, and nothing is recorded."""
        drifts = self.check_approvable(guide)
        record = claims_record(guide, claims, self.torch_version, force)
        at, matrix = self.release, self.lock.matrix
        kept = [r for r in self.lock.releases_of(guide.id) if r in matrix and r != at]
        approved = [self._approve_anchor(guide.id, d, at, kept) for d in drifts]
        records = self.lock.guides.get(guide.id, {})
        self.lock.guides[guide.id] = {**{r: records[r] for r in kept}, at: record}
        self._dirty = True
        return GuideApproval(guide.id, at, record, [a for a in approved if a is not None], self.prune(guide))

    def _approve_anchor(self, guide_id: str, drift: Drift, at: str, kept: list[str]) -> Approval | None:
        anchor, previous = drift.anchor, self.lock.get(guide_id, drift.anchor.name)
        keep = [r for r in kept if anchor.applies_to(r)]
        current = drift.current
        if current is None:  # scoped to other releases: it keeps serving those approved, or goes with them
            kept_entry = None
            if previous is not None and (served := {r: s for r in keep if (s := previous.serving(r)) is not None}):
                kept_entry = settle(anchor.symbol, anchor.pattern, previous.sources, served)
            self.lock.put(guide_id, anchor.name, kept_entry)
            return None
        entry = approve(
            previous,
            symbol=anchor.symbol,
            pattern=anchor.pattern,
            file=current.relpath,
            lines=(current.start, current.end),
            source=current.text,
            torch_version=at,
            keep=keep,
        )
        self.lock.put(guide_id, anchor.name, entry)
        source = entry.serving(at)
        assert source is not None
        return Approval(drift, source)

    def set_matrix(self, releases: Iterable[str]) -> list[str]:
        """Approve on a matrix of torch releases from now on (see ``reader.gate.lock``). Returns what it dropped
        (approvals and sources of releases outside it) and the guides approved on none of its releases."""
        if sorted_releases(release(r) for r in releases) == self.lock.matrix:
            return []
        dropped = self.lock.set_matrix(releases)
        self._dirty = True
        return dropped

    def prune(self, guide: Guide) -> list[str]:
        """Drop lock entries of ``guide`` whose anchors the guide no longer declares (on any release). Returns their
        keys."""
        names = {a.name for a in guide.anchors}
        stale = [k for k in self.lock.entries if k.partition("/")[0] == guide.id and k.partition("/")[2] not in names]
        for key in stale:
            del self.lock.entries[key]
            self._dirty = True
        return stale

    def prune_missing_guides(self, guide_ids: set[str]) -> list[str]:
        """Drop lock entries of guides not in ``guide_ids`` (only safe when every guide was loaded)."""
        stale = [k for k in self.lock.entries if k.partition("/")[0] not in guide_ids]
        for key in stale:
            del self.lock.entries[key]
            self._dirty = True
        for gone in [g for g in self.lock.guides if g not in guide_ids]:
            del self.lock.guides[gone]
            self._dirty = True
        return stale

    def save(self) -> bool:
        """Write the lock if this session approved or pruned something (never creates one for nothing)."""
        return self._lock.save() if self._lock is not None and self._dirty else False


def _reason(drift: Drift) -> str:
    if drift.error is not None:
        return drift.error.message
    return "; ".join(drift.problems) or drift.summary
