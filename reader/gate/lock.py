"""``readings/anchors.lock``: the torch source a person approved for each guide's anchors.

JSON, keys sorted, two-space indent, one approved source line per array element, so a review diff of the lock
shows the source lines that changed. Keyed ``<guide-id>/<anchor-name>``: two guides reading the same function
are approved separately, because each must be re-read on its own. Serialization is canonical:
``dumps(loads(text))`` reproduces ``text`` byte for byte for any text ``dumps`` wrote.

Example entry::

    "04-forward-prefetch/prefetch": {
      "approved_on": ["2.13.0+cpu"],
      "file": "torch/distributed/fsdp/_runtime_utils.py",
      "fingerprints": {"annotations": "…", "exact": "…", "normalized": "…", "signature": "…"},
      "lines": "1207-1235",
      "pattern": null,
      "source": ["@no_type_check", "def _prefetch_handle(", "…"],
      "symbol": "torch.distributed.fsdp._runtime_utils:_prefetch_handle"
    }

A lock can approve a matrix of torch versions (``"torch_matrix": ["2.13", "2.15"]`` in its header, set with
``fsdp-readings approve --matrix 2.13,2.15``). An anchor whose code differs between them then holds one approved
source per version: the newest version's in the entry's own fields, the others under ``"also_approved"`` (each
with its own ``file``, ``lines``, ``source``, ``fingerprints`` and ``approved_on``). Without a matrix, approving
new code replaces the old, and the lock is byte-identical to a lock written before matrices existed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from reader.source.files import write_atomic
from reader.source.fingerprint import ALGORITHM, Fingerprints, fingerprint

LOCK_FORMAT = 1
LOCK_NOTE = (
    "Approved torch source of the reading guides' anchors. Written only by `pytest readings/ --approve` "
    "and `fsdp-readings approve`, after a person re-read the guide against this source."
)


class LockError(ValueError):
    def __init__(self, path: Path, line: int, message: str) -> None:
        self.path, self.line, self.message = path, line, message
        super().__init__(f"{path}:{line}: {message}")


@dataclass(frozen=True)
class LockEntry:
    symbol: str
    pattern: str | None
    file: str  # relative to the directory holding torch/
    lines: tuple[int, int]
    source: str  # always ends with a newline
    fingerprints: Fingerprints
    approved_on: tuple[str, ...]  # torch versions a person approved this exact source on, oldest first
    # Sources approved on other torch versions of the lock's matrix, newest first (same symbol and pattern).
    also_approved: tuple[LockEntry, ...] = ()

    def __post_init__(self) -> None:
        if not self.source.endswith("\n"):  # the lock stores lines; a final newline is implied
            object.__setattr__(self, "source", self.source + "\n")

    @property
    def sources(self) -> tuple[LockEntry, ...]:
        """Every approved source of this anchor, each alone, newest version first."""
        return (replace(self, also_approved=()), *self.also_approved)

    def for_version(self, torch_version: str | None) -> LockEntry:
        """The approved source a run on ``torch_version`` is compared with when its code matches none: the one
        approved on the newest version not above it, else the oldest (a version below all of them)."""
        sources = self.sources
        if len(sources) == 1 or parse_version(torch_version) is None:
            return sources[0]
        current = (1, parse_version(torch_version))
        ranked = sorted(sources, key=lambda s: newest(s.approved_on))
        below = [s for s in ranked if newest(s.approved_on) <= current]
        return below[-1] if below else ranked[0]

    def to_json(self) -> dict[str, object]:
        data = self._source_json()
        data.update(symbol=self.symbol, pattern=self.pattern)
        if self.also_approved:
            data["also_approved"] = [other._source_json() for other in self.also_approved]
        return data

    def _source_json(self) -> dict[str, object]:
        return {
            "file": self.file,
            "lines": f"{self.lines[0]}-{self.lines[1]}",
            "source": self.source[:-1].split("\n"),
            "fingerprints": self.fingerprints.to_json(),
            "approved_on": list(self.approved_on),
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> LockEntry:
        if missing := [k for k in ("symbol", "pattern") if k not in data]:
            raise ValueError(f"missing {', '.join(f'`{k}`' for k in missing)}")
        entry = cls._from_json(data, data["symbol"], data["pattern"])
        others = data.get("also_approved", [])
        if not (isinstance(others, list) and all(isinstance(o, dict) for o in others)):
            raise ValueError("`also_approved` must be a list of approved sources")
        return replace(entry, also_approved=tuple(cls._from_json(o, entry.symbol, entry.pattern) for o in others))

    @classmethod
    def _from_json(cls, data: dict[str, object], symbol: object, pattern: object) -> LockEntry:
        data = {**data, "symbol": symbol, "pattern": pattern}
        missing = [
            k for k in ("symbol", "pattern", "file", "lines", "source", "fingerprints", "approved_on") if k not in data
        ]
        if missing:
            raise ValueError(f"missing {', '.join(f'`{k}`' for k in missing)}")
        source_lines = data["source"]
        lines = data["lines"]
        prints = data["fingerprints"]
        approved_on = data["approved_on"]
        if not (isinstance(source_lines, list) and all(isinstance(s, str) for s in source_lines) and source_lines):
            raise ValueError("`source` must be a non-empty list of strings")
        span = re.fullmatch(r"(\d+)-(\d+)", lines) if isinstance(lines, str) else None
        if span is None:
            raise ValueError('`lines` must be "first-last"')
        if not isinstance(prints, dict):
            raise ValueError("`fingerprints` must be an object")
        if not (isinstance(approved_on, list) and all(isinstance(v, str) for v in approved_on)):
            raise ValueError("`approved_on` must be a list of torch versions")
        symbol, pattern, file = data["symbol"], data["pattern"], data["file"]
        if (
            not isinstance(symbol, str)
            or not isinstance(file, str)
            or not (pattern is None or isinstance(pattern, str))
        ):
            raise ValueError("`symbol` and `file` must be strings, `pattern` a string or null")
        return cls(
            symbol=symbol,
            pattern=pattern,
            file=file,
            lines=(int(span.group(1)), int(span.group(2))),
            source="\n".join(source_lines) + "\n",
            fingerprints=Fingerprints(
                **{k: prints.get(k) for k in ("exact", "normalized", "annotations", "signature")}
            ),
            approved_on=tuple(approved_on),
        )


@dataclass
class Lock:
    path: Path
    entries: dict[str, LockEntry] = field(default_factory=dict)
    algorithm: int = ALGORITHM
    # Torch releases ("2.13", "2.15.0") whose approved sources are all kept; empty: the newest approval wins.
    matrix: tuple[str, ...] = ()

    @staticmethod
    def key(guide_id: str, anchor_name: str) -> str:
        return f"{guide_id}/{anchor_name}"

    def get(self, guide_id: str, anchor_name: str) -> LockEntry | None:
        return self.entries.get(self.key(guide_id, anchor_name))

    def approved_fingerprints(self, entry: LockEntry) -> Fingerprints:
        """The entry's fingerprints under the current algorithm: stored ones if the algorithm matches, else
        recomputed from the approved source (which is why the source is kept)."""
        if self.algorithm == ALGORITHM:
            return entry.fingerprints
        return fingerprint(entry.source)

    def put(self, guide_id: str, anchor_name: str, entry: LockEntry) -> None:
        self.entries[self.key(guide_id, anchor_name)] = entry

    def set_matrix(self, releases: tuple[str, ...]) -> list[str]:
        """Keep the approved sources of these releases from now on, and drop, from every entry, sources approved
        only on releases outside it (an entry always keeps at least its newest source). Returns what it
        dropped, as ``key (torch versions)``."""
        for release in releases:
            check_release(release)
        self.matrix = tuple(sorted(set(releases), key=Version))
        dropped: list[str] = []
        for key, entry in list(self.entries.items()):
            if not self.matrix or len(entry.sources) == 1:
                continue
            kept = [s for s in entry.sources if in_matrix(s.approved_on, self.matrix)] or [entry.sources[0]]
            dropped += [f"{key} ({', '.join(s.approved_on)})" for s in entry.sources if s not in kept]
            self.entries[key] = combine(kept)
        return dropped

    def dumps(self) -> str:
        document: dict[str, object] = {
            "format": LOCK_FORMAT,
            "fingerprint_algorithm": self.algorithm,
            "note": LOCK_NOTE,
            "anchors": {key: entry.to_json() for key, entry in self.entries.items()},
        }
        if self.matrix:
            document["torch_matrix"] = list(self.matrix)
        return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def loads(cls, text: str, path: Path) -> Lock:
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LockError(path, exc.lineno, f"not valid JSON: {exc.msg}") from exc
        if not isinstance(document, dict) or document.get("format") != LOCK_FORMAT:
            raise LockError(path, 1, f"not an anchors lock of format {LOCK_FORMAT}")
        anchors = document.get("anchors")
        if not isinstance(anchors, dict):
            raise LockError(path, 1, "`anchors` must be an object")
        entries: dict[str, LockEntry] = {}
        for key, raw in anchors.items():
            try:
                if not isinstance(raw, dict):
                    raise ValueError("entry must be an object")
                entries[key] = LockEntry.from_json(raw)
            except (KeyError, TypeError, ValueError) as exc:
                raise LockError(path, _line_of(text, f'"{key}"'), f"entry {key}: {exc}") from exc
        algorithm = document.get("fingerprint_algorithm", ALGORITHM)
        matrix = document.get("torch_matrix", [])
        try:
            if not (isinstance(matrix, list) and all(isinstance(r, str) for r in matrix)):
                raise ValueError("`torch_matrix` must be a list of torch releases")
            for release in matrix:
                check_release(release)
        except ValueError as exc:
            raise LockError(path, _line_of(text, '"torch_matrix"'), str(exc)) from exc
        return cls(
            path=path,
            entries=entries,
            algorithm=algorithm if isinstance(algorithm, int) else -1,
            matrix=tuple(matrix),
        )

    @classmethod
    def load(cls, path: Path) -> Lock:
        if not path.exists():
            return cls(path=path)
        return cls.loads(path.read_text(encoding="utf-8"), path)

    def save(self) -> bool:
        """Write the lock if its bytes changed. Returns whether it wrote. Atomic: never a half-written
        lock."""
        if self.algorithm != ALGORITHM:  # upgrade every entry, so the header never lies about its fingerprints
            self.entries = {k: replace(e, fingerprints=fingerprint(e.source)) for k, e in self.entries.items()}
            self.algorithm = ALGORITHM
        text = self.dumps()
        if self.path.exists() and self.path.read_text(encoding="utf-8") == text:
            return False
        write_atomic(self.path, text)
        return True


def approve(
    previous: LockEntry | None,
    *,
    symbol: str,
    pattern: str | None,
    file: str,
    lines: tuple[int, int],
    source: str,
    torch_version: str | None,
    matrix: tuple[str, ...] = (),
) -> LockEntry:
    """The entry recording that a person approved ``source`` on ``torch_version``. Re-approving identical source
    adds the version to its ``approved_on``. Approving different source starts its list afresh; the other
    approved sources stay only if a release of ``matrix`` approved them (minus this version, which approves one
    source)."""
    version = torch_version or "unknown"
    same_anchor = previous is not None and (previous.symbol, previous.pattern) == (symbol, pattern)
    sources = previous.sources if previous is not None and same_anchor else ()
    text = source if source.endswith("\n") else source + "\n"
    same = next((s for s in sources if s.source == text), None)
    approved = LockEntry(
        symbol=symbol,
        pattern=pattern,
        file=file,
        lines=lines,
        source=source,
        fingerprints=fingerprint(source),
        approved_on=tuple(_sorted_versions({*(same.approved_on if same else ()), version})),
    )
    others = [replace(s, approved_on=tuple(v for v in s.approved_on if v != version)) for s in sources if s is not same]
    kept = [s for s in others if s.approved_on and in_matrix(s.approved_on, matrix)]
    return combine([approved, *kept])


def combine(sources: list[LockEntry]) -> LockEntry:
    """One entry from approved sources of the same anchor: the newest version's first, the rest under it."""
    ordered = sorted(sources, key=lambda s: newest(s.approved_on), reverse=True)
    return replace(ordered[0], also_approved=tuple(replace(s, also_approved=()) for s in ordered[1:]))


def parse_version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def newest(versions: tuple[str, ...]) -> tuple[int, Version]:
    """Sort key: the newest parseable version of a list; unparseable ones ("unknown") sort first."""
    parsed = [v for v in map(parse_version, versions) if v is not None]
    return (1, max(parsed)) if parsed else (0, Version("0"))


def check_release(release: str) -> None:
    if not re.fullmatch(r"\d+(\.\d+){1,2}", release):
        raise ValueError(f"`{release}` is not a torch release such as `2.13` or `2.15.0`")


def in_matrix(versions: tuple[str, ...], matrix: tuple[str, ...]) -> bool:
    """Whether any of ``versions`` belongs to a release of ``matrix`` ("2.13" holds 2.13.0+cpu and 2.13.1)."""
    for text in versions:
        version = parse_version(text)
        if version is not None and any(SpecifierSet(f"=={r}.*").contains(version, prereleases=True) for r in matrix):
            return True
    return False


def _sorted_versions(versions: set[str]) -> list[str]:
    def key(v: str) -> tuple[int, Version | str]:
        try:
            return (0, Version(v))
        except InvalidVersion:
            return (1, v)

    return sorted(versions, key=key)


def _line_of(text: str, needle: str) -> int:
    index = text.find(needle)
    return text.count("\n", 0, index) + 1 if index >= 0 else 1
