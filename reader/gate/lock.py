"""``readings/anchors.lock``: the torch source a person approved for each guide's anchors, and per guide the torch
releases it was approved on, with what its claims did there.

JSON, keys sorted, two-space indent, one source line per array element, so that a review diff of the lock shows
the source lines that changed (``reader.gate.lock_file`` reads and writes it). Anchors are keyed
``<guide-id>/<anchor-name>``: two guides reading the same function are approved separately, because each must be
re-read on its own.

Releases are canonical (``2.15.0``; no build tag, see ``reader.gate.releases``). An anchor holds one approved
source per release where its code differs, oldest first. A source's ``approved_on`` lists the releases from which
it holds: on an approved release of its guide the anchor reads the source with the newest of these at or below
it (`LockEntry.serving`). So approving a guide on a new release leaves the entries whose code did not change as
they are, and adds one source, as its changes to the source before it, where the code did change.

A lock can keep a matrix of releases (``"torch_matrix": ["2.13.0", "2.15.0"]``, set with ``fsdp-readings
approve --matrix 2.13,2.15``): approving on one of them keeps the sources the others are approved on. Without a
matrix, approving on a release replaces what older releases were approved on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from reader.gate import lock_file
from reader.gate.lock_entries import ApprovedSource, GuideRecord, LockEntry, approve, settle
from reader.gate.releases import UNKNOWN, release, release_or_unknown, sorted_releases
from reader.source.files import write_atomic

__all__ = ["ApprovedSource", "GuideRecord", "Lock", "LockEntry", "LockError", "approve", "in_matrix"]


class LockError(ValueError):
    def __init__(self, path: Path, line: int, message: str) -> None:
        self.path, self.line, self.message = path, line, message
        super().__init__(f"{path}:{line}: {message}")


@dataclass
class Lock:
    path: Path
    entries: dict[str, LockEntry] = field(default_factory=dict)
    guides: dict[str, dict[str, GuideRecord]] = field(default_factory=dict)  # guide id → release → record
    matrix: tuple[str, ...] = ()  # canonical releases whose approvals are all kept; empty: the newest wins

    @staticmethod
    def key(guide_id: str, anchor_name: str) -> str:
        return f"{guide_id}/{anchor_name}"

    def get(self, guide_id: str, anchor_name: str) -> LockEntry | None:
        return self.entries.get(self.key(guide_id, anchor_name))

    def put(self, guide_id: str, anchor_name: str, entry: LockEntry | None) -> None:
        key = self.key(guide_id, anchor_name)
        if entry is None:
            self.entries.pop(key, None)
        else:
            self.entries[key] = entry

    def releases_of(self, guide_id: str) -> tuple[str, ...]:
        """The releases ``guide_id`` is approved on, oldest first."""
        return sorted_releases(self.guides.get(guide_id, {}))

    def entries_of(self, guide_id: str) -> dict[str, LockEntry]:
        """Anchor name → entry, for one guide."""
        prefix = f"{guide_id}/"
        return {k.removeprefix(prefix): e for k, e in self.entries.items() if k.startswith(prefix)}

    def set_matrix(self, releases: Iterable[str]) -> list[str]:
        """Keep the approvals of these releases from now on, and drop the others': a guide's records of releases
        outside the matrix, and the sources only those releases read. A guide approved on no release of the matrix
        keeps what it has (there is nothing to replace it with). Returns one sentence per thing dropped or kept so."""
        self.matrix = sorted_releases(release(r) for r in releases)
        said: list[str] = []
        if not self.matrix:
            return said
        for guide_id, records in sorted(self.guides.items()):
            kept = {r: rec for r, rec in records.items() if r in self.matrix}
            if not kept:
                said.append(f"kept {guide_id}'s approval on {', '.join(sorted_releases(records))}: it has none on "
                            "a release of the matrix; approve it on one")  # fmt: skip
                continue
            for gone in sorted_releases(set(records) - set(kept)):
                said.append(f"dropped {guide_id}'s approval on {gone}")
            self.guides[guide_id] = kept
            for name, entry in self.entries_of(guide_id).items():
                served = {r: s for r in kept if (s := entry.serving(r)) is not None}
                if not served:
                    continue
                settled = settle(entry.symbol, entry.pattern, entry.sources, served)
                for source in entry.sources:
                    if not any(s.source == source.source for s in settled.sources):
                        said.append(f"dropped {self.key(guide_id, name)}'s source from {', '.join(source.approved_on)}")
                self.put(guide_id, name, settled)
        return said

    def dumps(self) -> str:
        return lock_file.dumps(lock_file.LockData(self.entries, self.guides, self.matrix))

    @classmethod
    def loads(cls, text: str, path: Path) -> Lock:
        try:
            data = lock_file.loads(text)
        except json.JSONDecodeError as exc:
            raise LockError(path, exc.lineno, f"not valid JSON: {exc.msg}") from exc
        except lock_file.FormatProblem as exc:
            raise LockError(path, _line_of(text, exc.near) if exc.near else 1, str(exc)) from exc
        return cls(path=path, entries=data.entries, guides=data.guides, matrix=data.matrix)

    @classmethod
    def load(cls, path: Path) -> Lock:
        if not path.exists():
            return cls(path=path)
        return cls.loads(path.read_text(encoding="utf-8"), path)

    def save(self) -> bool:
        """Write the lock if its bytes changed. Returns whether it wrote. Atomic: never a half-written lock."""
        text = self.dumps()
        if self.path.exists() and self.path.read_text(encoding="utf-8") == text:
            return False
        write_atomic(self.path, text)
        return True


def in_matrix(versions: Iterable[str], matrix: Iterable[str]) -> bool:
    """Whether any of ``versions`` is a release of ``matrix`` (``2.13`` names 2.13.0, with any build tag)."""
    wanted = {release_or_unknown(r) for r in matrix}
    return any(v != UNKNOWN and v in wanted for v in map(release_or_unknown, versions))


def _line_of(text: str, needle: str) -> int:
    index = text.find(needle)
    return text.count("\n", 0, index) + 1 if index >= 0 else 1
