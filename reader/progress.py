"""A learner's predict scores, kept in the user's data directory (never in the repository).

One JSON file, ``progress.json``, under platformdirs' user data dir for ``fsdp-readings`` (``~/.local/share/
fsdp-readings`` on Linux), or under ``$FSDP_READINGS_DATA_DIR`` when set (tests, shared machines). It maps guide
id → question id → the latest answer: what was typed, whether it agreed with the run, and when.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from platformdirs import user_data_dir

ENV = "FSDP_READINGS_DATA_DIR"


def data_dir() -> Path:
    return Path(os.environ.get(ENV) or user_data_dir("fsdp-readings", appauthor=False))


@dataclass(frozen=True)
class Attempt:
    answer: str
    correct: bool | None  # None: a text answer, compared by the learner, not scored
    observed: Any
    at: str


class Progress:
    """The scores file, read once and written whole."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else data_dir() / "progress.json"
        try:
            self.data: dict[str, dict[str, dict[str, Any]]] = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            self.data = {}
        except (OSError, ValueError) as exc:
            raise ProgressError(f"{self.path}: unreadable progress file ({exc}); move it away to start afresh") from exc

    def record(self, guide_id: str, question_id: str, answer: str, correct: bool | None, observed: Any) -> None:
        at = datetime.now(UTC).isoformat(timespec="seconds")
        attempt = Attempt(answer, correct, _plain(observed), at)
        self.data.setdefault(guide_id, {})[question_id] = asdict(attempt)

    def score(self, guide_id: str) -> tuple[int, int]:
        """(right, scored) over the guide's latest attempts; text answers are not scored."""
        attempts = self.data.get(guide_id, {}).values()
        scored = [a for a in attempts if a.get("correct") is not None]
        return sum(1 for a in scored if a["correct"]), len(scored)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(self.path)


class ProgressError(RuntimeError):
    pass


def _plain(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value
