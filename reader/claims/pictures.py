"""The pictures of each claim's last passing run, kept beside the progress file (``pictures.json`` in
`reader.claims.progress.data_dir`), so the site can draw them without running a claim: rank 0's memory series
(``series``) and flat-parameter layout (``layout``), for the claims whose ``views`` declare ``memory`` or
``layout``, each with the torch it ran on. A run that failed records nothing: a picture shows what held."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reader.claims.progress import data_dir
from reader.source.files import write_atomic

FILE = "pictures.json"
DRAWN = {"memory": "series", "layout": "layout"}  # the view a claim declares → the key its check returns


class Pictures:
    """``pictures.json``: guide id → claim id → {"torch": version, "series": ..., "layout": ...}."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else data_dir() / FILE
        try:
            self.data: dict[str, dict[str, dict[str, Any]]] = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            self.data = {}
        except (OSError, ValueError):
            self.data = {}  # a cache of pictures: an unreadable one is redrawn by the next run, not an error

    def record(self, guide_id: str, claim_id: str, views: tuple[str, ...], value: Any, torch: str | None) -> bool:
        """Keep what rank 0's ``value`` holds for the declared ``views``; whether anything was kept."""
        if not isinstance(value, Mapping):
            return False
        kept = {key: value[key] for view, key in DRAWN.items() if view in views and value.get(key)}
        if not kept:
            return False
        try:
            json.dumps(kept)
        except (TypeError, ValueError):
            return False
        self.data.setdefault(guide_id, {})[claim_id] = {"torch": torch, **kept}
        return True

    def of(self, guide_id: str, claim_id: str, torch: str | None) -> dict[str, Any]:
        """The pictures of a claim's last passing run on ``torch`` (empty when it has none there)."""
        entry = self.data.get(guide_id, {}).get(claim_id, {})
        return {k: v for k, v in entry.items() if k != "torch"} if entry.get("torch") == torch else {}

    def save(self) -> None:
        write_atomic(self.path, json.dumps(self.data, sort_keys=True) + "\n")
