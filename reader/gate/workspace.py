"""The engine the pytest plugin and the CLI share: guides + a torch source + the lock → drift, approvals.

One ``Workspace`` per session. It resolves each (symbol, pattern) once, reads the lock lazily (so a session
that collects no guide never touches it), and holds approvals in memory until ``save`` writes them in one
atomic write.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from reader.format.guide import AnchorSpec, Guide
from reader.gate.drift import Drift, DriftKind, classify
from reader.gate.lock import Lock, LockEntry, approve
from reader.source.anchors import AnchorError, Resolution, Resolver
from reader.source.files import relative_to_cwd
from reader.source.index import IndexCache
from reader.source.torch_source import TorchSource

LOCK_NAME = "anchors.lock"


class NotApprovable(Exception):
    def __init__(self, drift: Drift) -> None:
        self.drift = drift
        reason = drift.error.render() if drift.error else "\n".join(drift.problems) or drift.summary
        super().__init__(f"cannot approve {drift.key}: {reason}")


@dataclass(frozen=True)
class Approval:
    drift: Drift  # what the anchor looked like against the lock before approval
    entry: LockEntry  # the source approved (one of the entry's sources when the lock keeps a matrix)


def _with_newline(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


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

    def resolutions(self, guide: Guide) -> tuple[dict[str, Resolution], dict[str, AnchorError]]:
        ok: dict[str, Resolution] = {}
        failed: dict[str, AnchorError] = {}
        for anchor in guide.anchors:
            found = self.current(anchor)
            if isinstance(found, AnchorError):
                failed[anchor.name] = found
            else:
                ok[anchor.name] = found
        return ok, failed

    def drift(self, guide: Guide, anchor: AnchorSpec) -> Drift:
        current = self.current(anchor)
        found = classify(
            guide.id,
            anchor,
            approved=self.lock.get(guide.id, anchor.name),
            lock=self.lock,
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
        for block in guide.source_blocks(anchor.name):
            notes = block.notes_for(self.torch_version)
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

    def approve(self, guide: Guide, anchor: AnchorSpec) -> Approval:
        """Record the anchor's current source as approved. Refuses what cannot be pinned (removed, pattern
        lost)."""
        before = self.drift(guide, anchor)
        current = before.current
        if current is None or before.problems:
            raise NotApprovable(before)
        entry = approve(
            self.lock.get(guide.id, anchor.name),
            symbol=anchor.symbol,
            pattern=anchor.pattern,
            file=current.relpath,
            lines=(current.start, current.end),
            source=current.text,
            torch_version=self.torch_version,
            matrix=self.lock.matrix,
        )
        self.lock.put(guide.id, anchor.name, entry)
        self._dirty = True
        approval = Approval(before, next(s for s in entry.sources if s.source == _with_newline(current.text)))
        self.approvals.append(approval)
        return approval

    def set_matrix(self, releases: tuple[str, ...]) -> list[str]:
        """Approve on a matrix of torch releases from now on (see ``reader.gate.lock``). Returns the approved
        sources it dropped because no release of the matrix holds them."""
        if releases == self.lock.matrix:
            return []
        dropped = self.lock.set_matrix(releases)
        self._dirty = True
        return dropped

    def prune(self, guide: Guide) -> list[str]:
        """Drop lock entries of ``guide`` whose anchors the guide no longer declares. Returns their keys."""
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
        return stale

    def save(self) -> bool:
        """Write the lock if this session approved or pruned something (never creates one for nothing)."""
        return self._lock.save() if self._lock is not None and self._dirty else False
