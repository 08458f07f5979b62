"""The lock's file: JSON of format 2 written, formats 1 and 2 read.

Canonical: ``dumps(loads(text))`` reproduces ``text`` byte for byte for any text ``dumps`` wrote. Keys sorted,
two-space indent, one source line per array element. An entry's oldest source is stored whole; each later one
under ``updates`` as its changes to the one before it (``reader.gate.source_changes``). No hashes: fingerprints
are computed from the text, so nothing in the lock is noise to review. Example::

    "anchors": {
      "03-unshard-reshard/use-sharded": {
        "approved_on": ["2.13.0"],
        "file": "torch/distributed/fsdp/_flat_param.py",
        "lines": "1620-1660",
        "pattern": null,
        "source": ["def _use_sharded_flat_param(self) -> None:", "…"],
        "symbol": "torch.distributed.fsdp._flat_param:FlatParamHandle._use_sharded_flat_param",
        "updates": [
          {"approved_on": ["2.15.0"], "changes": ["@@ -1645,1 +1645,1 @@", "-…", "+…"],
           "file": "torch/distributed/fsdp/_flat_param.py", "lines": "1620-1660"}
        ]
      }
    },
    "guides": {"03-unshard-reshard": {"2.13.0": {"claims_held": 7}, "2.15.0": {"claims_held": 7}}},
    "torch_matrix": ["2.13.0", "2.15.0"]

Format 1 (fingerprints stored, ``also_approved`` newest first, build tags in versions, no guide records) is
read as what it says: its releases become the guides' records, with claims not recorded (``claims_held:
null``), and the next save writes format 2.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from reader.gate.lock_entries import ApprovedSource, GuideRecord, LockEntry
from reader.gate.releases import release, release_or_unknown, sorted_releases
from reader.gate.source_changes import ChangeError, apply, changes

LOCK_FORMAT = 2
READABLE_FORMATS = (1, 2)
LOCK_NOTE = (
    "Approved torch source of the reading guides' anchors, and the releases each guide was approved on with what "
    "its claims did there. Written only by `pytest readings/ --approve=<guide>` and `fsdp-readings approve "
    "<guide>`, after a person re-read the guide and its claims passed on that torch."
)


@dataclass(frozen=True)
class LockData:
    entries: dict[str, LockEntry]
    guides: dict[str, dict[str, GuideRecord]]
    matrix: tuple[str, ...]


class FormatProblem(ValueError):
    """A problem in the lock, with the text to find its line by."""

    def __init__(self, message: str, near: str | None = None) -> None:
        super().__init__(message)
        self.near = near


def dumps(data: LockData) -> str:
    document: dict[str, object] = {
        "format": LOCK_FORMAT,
        "note": LOCK_NOTE,
        "anchors": {key: _entry_json(entry) for key, entry in data.entries.items()},
        "guides": {gid: {r: _record_json(rec) for r, rec in recs.items()} for gid, recs in data.guides.items()},
    }
    if data.matrix:
        document["torch_matrix"] = list(data.matrix)
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def loads(text: str) -> LockData:
    """Raises `FormatProblem` (with what to search for its line) or `json.JSONDecodeError`."""
    document = json.loads(text)
    if not isinstance(document, dict) or document.get("format") not in READABLE_FORMATS:
        raise FormatProblem(f"not an anchors lock of format {' or '.join(map(str, READABLE_FORMATS))}")
    anchors = document.get("anchors")
    if not isinstance(anchors, dict):
        raise FormatProblem("`anchors` must be an object")
    read = _entry_v1 if document["format"] == 1 else _entry_v2
    entries: dict[str, LockEntry] = {}
    for key, raw in anchors.items():
        try:
            if not isinstance(raw, dict):
                raise ValueError("entry must be an object")
            entries[key] = read(raw)
        except (KeyError, TypeError, ValueError, ChangeError) as exc:
            raise FormatProblem(f"entry {key}: {exc}", f'"{key}"') from exc
    matrix = document.get("torch_matrix", [])
    if not (isinstance(matrix, list) and all(isinstance(r, str) for r in matrix)):
        raise FormatProblem("`torch_matrix` must be a list of torch releases", '"torch_matrix"')
    try:
        canonical = sorted_releases(release(r) for r in matrix)
    except ValueError as exc:
        raise FormatProblem(str(exc), '"torch_matrix"') from exc
    guides = _records_v1(entries) if document["format"] == 1 else _guides_v2(document.get("guides", {}))
    return LockData(entries, guides, canonical)


# --- format 2 -------------------------------------------------------------------------------------------------


def _entry_json(entry: LockEntry) -> dict[str, object]:
    base, *later = entry.sources
    data: dict[str, object] = {
        "symbol": entry.symbol,
        "pattern": entry.pattern,
        **_where(base),
        "source": base.source[:-1].split("\n"),
    }
    updates = []
    previous = base
    for source in later:
        hunks = changes(previous.source, previous.lines[0], source.source, source.lines[0])
        updates.append({**_where(source), "changes": hunks})
        previous = source
    if updates:
        data["updates"] = updates
    return data


def _where(source: ApprovedSource) -> dict[str, object]:
    return {
        "file": source.file,
        "lines": f"{source.lines[0]}-{source.lines[1]}",
        "approved_on": list(source.approved_on),
    }


def _entry_v2(raw: dict[str, Any]) -> LockEntry:
    symbol, pattern = _anchor(raw)
    base = _source(raw, "\n".join(_strings(raw, "source", "`source` must be a non-empty list of strings")) + "\n")
    sources = [base]
    updates = raw.get("updates", [])
    if not (isinstance(updates, list) and all(isinstance(u, dict) for u in updates)):
        raise ValueError("`updates` must be a list of objects")
    for update in updates:
        hunks = update.get("changes")
        if not (isinstance(hunks, list) and all(isinstance(h, str) for h in hunks)):
            raise ValueError("an update's `changes` must be a list of strings")
        previous = sources[-1]
        sources.append(_source(update, apply(previous.source, previous.lines[0], hunks)))
    return LockEntry(symbol, pattern, tuple(sources))


def _record_json(record: GuideRecord) -> dict[str, object]:
    data: dict[str, object] = {"claims_held": record.held}
    for key, values in (("claims_skipped", record.skipped), ("claims_failed", record.failed),
                        ("claims_not_run", record.not_run)):  # fmt: skip
        if values:
            data[key] = list(values)
    if record.forced is not None:
        data["forced"] = record.forced
    return data


def _guides_v2(raw: object) -> dict[str, dict[str, GuideRecord]]:
    if not isinstance(raw, dict):
        raise FormatProblem("`guides` must be an object", '"guides"')
    guides: dict[str, dict[str, GuideRecord]] = {}
    for gid, records in raw.items():
        if not isinstance(records, dict):
            raise FormatProblem(f"guide {gid}: must map torch releases to records", f'"{gid}": {{')
        guides[gid] = {}
        for at, record in records.items():
            try:
                guides[gid][release(at)] = _record(record)
            except ValueError as exc:
                raise FormatProblem(f"guide {gid}, torch {at}: {exc}", f'"{gid}": {{') from exc
    return guides


def _record(raw: object) -> GuideRecord:
    if not isinstance(raw, dict):
        raise ValueError("a record must be an object")
    held = raw.get("claims_held")
    if held is not None and (type(held) is not int or held < 0):
        raise ValueError("`claims_held` must be a count, or null when it was not recorded")
    lists = {}
    for key in ("claims_skipped", "claims_failed", "claims_not_run"):
        value = raw.get(key, [])
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ValueError(f"`{key}` must be a list of claim ids")
        lists[key] = tuple(value)
    forced = raw.get("forced")
    if forced is not None and not (isinstance(forced, str) and forced.strip()):
        raise ValueError("`forced` must be the reason a person gave")
    if (lists["claims_failed"] or lists["claims_not_run"]) and forced is None:
        raise ValueError("claims that failed or did not run are recorded only with the `forced` reason")
    return GuideRecord(held, lists["claims_skipped"], lists["claims_failed"], lists["claims_not_run"], forced)


# --- shared -------------------------------------------------------------------------------------------------


def _anchor(raw: dict[str, Any]) -> tuple[str, str | None]:
    if missing := [k for k in ("symbol", "pattern") if k not in raw]:
        raise ValueError(f"missing {', '.join(f'`{k}`' for k in missing)}")
    symbol, pattern = raw["symbol"], raw["pattern"]
    if not isinstance(symbol, str) or not (pattern is None or isinstance(pattern, str)):
        raise ValueError("`symbol` must be a string, `pattern` a string or null")
    return symbol, pattern


def _source(raw: dict[str, Any], text: str) -> ApprovedSource:
    if missing := [k for k in ("file", "lines", "approved_on") if k not in raw]:
        raise ValueError(f"missing {', '.join(f'`{k}`' for k in missing)}")
    span = re.fullmatch(r"(\d+)-(\d+)", raw["lines"]) if isinstance(raw["lines"], str) else None
    if span is None:
        raise ValueError('`lines` must be "first-last"')
    if not isinstance(raw["file"], str):
        raise ValueError("`file` must be a string")
    approved_on = raw["approved_on"]
    if not (isinstance(approved_on, list) and approved_on and all(isinstance(v, str) for v in approved_on)):
        raise ValueError("`approved_on` must be a non-empty list of torch releases")
    return ApprovedSource(raw["file"], (int(span.group(1)), int(span.group(2))), text, sorted_releases(approved_on))


def _strings(raw: dict[str, Any], key: str, message: str) -> list[str]:
    value = raw.get(key)
    if not (isinstance(value, list) and value and all(isinstance(s, str) for s in value)):
        raise ValueError(message)
    return value


# --- format 1 -------------------------------------------------------------------------------------------------


def _entry_v1(raw: dict[str, Any]) -> LockEntry:
    symbol, pattern = _anchor(raw)
    others = raw.get("also_approved", [])
    if not (isinstance(others, list) and all(isinstance(o, dict) for o in others)):
        raise ValueError("`also_approved` must be a list of approved sources")
    sources = []
    for one in (raw, *others):
        text = "\n".join(_strings(one, "source", "`source` must be a non-empty list of strings")) + "\n"
        sources.append(_source(one, text))
    return LockEntry(symbol, pattern, tuple(sorted(sources, key=lambda s: s.first)))


def _records_v1(entries: dict[str, LockEntry]) -> dict[str, dict[str, GuideRecord]]:
    """Format 1 kept no guide records: a guide was approved on the releases its entries name."""
    releases: dict[str, set[str]] = {}
    for key, entry in entries.items():
        releases.setdefault(key.partition("/")[0], set()).update(map(release_or_unknown, entry.approved_on))
    return {gid: {r: GuideRecord(held=None) for r in sorted_releases(rs)} for gid, rs in sorted(releases.items())}
