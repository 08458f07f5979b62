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
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.version import InvalidVersion, Version

from reader.fingerprint import ALGORITHM, Fingerprints, fingerprint
from reader.fsutil import write_atomic

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

    def __post_init__(self) -> None:
        if not self.source.endswith("\n"):  # the lock stores lines; a final newline is implied
            object.__setattr__(self, "source", self.source + "\n")

    def to_json(self) -> dict[str, object]:
        return {
            "symbol": self.symbol,
            "pattern": self.pattern,
            "file": self.file,
            "lines": f"{self.lines[0]}-{self.lines[1]}",
            "source": self.source[:-1].split("\n"),
            "fingerprints": self.fingerprints.to_json(),
            "approved_on": list(self.approved_on),
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> LockEntry:
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

    def dumps(self) -> str:
        document = {
            "format": LOCK_FORMAT,
            "fingerprint_algorithm": self.algorithm,
            "note": LOCK_NOTE,
            "anchors": {key: entry.to_json() for key, entry in self.entries.items()},
        }
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
        return cls(path=path, entries=entries, algorithm=algorithm if isinstance(algorithm, int) else -1)

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
) -> LockEntry:
    """The entry recording that a person approved ``source``. Re-approving identical source on a new torch
    version adds the version to ``approved_on``; approving different source starts the list afresh."""
    version = torch_version or "unknown"
    same = previous is not None and (previous.source, previous.symbol, previous.pattern) == (
        source,
        symbol,
        pattern,
    )
    versions = _sorted_versions({*previous.approved_on, version}) if same and previous else [version]
    return LockEntry(
        symbol=symbol,
        pattern=pattern,
        file=file,
        lines=lines,
        source=source,
        fingerprints=fingerprint(source),
        approved_on=tuple(versions),
    )


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
