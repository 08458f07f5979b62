"""A learner's predict scores, kept in the user's data directory (never in the repository).

One JSON file, ``progress.json``, under platformdirs' user data dir for ``fsdp-readings`` (``~/.local/share/
fsdp-readings`` on Linux), or under ``$FSDP_READINGS_DATA_DIR`` when set (tests, shared machines). Three sections,
each guide id → item id → the latest attempt: ``predict`` (what was typed, whether it agreed with the run),
``exercises`` (the claim guessed, whether right) and ``claims`` (the last result of each claim a study command
ran).
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
        self._put("predict", guide_id, question_id, asdict(Attempt(answer, correct, _plain(observed), _now())))

    def record_exercise(self, guide_id: str, exercise_id: str, answer: str, correct: bool, observed: str) -> None:
        self._put("exercises", guide_id, exercise_id, asdict(Attempt(answer, correct, observed, _now())))

    def record_claim(self, guide_id: str, claim_id: str, result: str) -> None:
        self._put("claims", guide_id, claim_id, {"result": result, "at": _now()})

    def score(self, guide_id: str, section: str = "predict") -> tuple[int, int]:
        """(right, scored) over the guide's latest attempts in ``section``; text answers are not scored."""
        attempts = self.data.get(section, {}).get(guide_id, {}).values()
        scored = [a for a in attempts if a.get("correct") is not None]
        return sum(1 for a in scored if a["correct"]), len(scored)

    def claims(self, guide_id: str) -> dict[str, str]:
        """The last result of each claim a study command ran (passed / failed / skipped)."""
        return {cid: entry["result"] for cid, entry in self.data.get("claims", {}).get(guide_id, {}).items()}

    def _put(self, section: str, guide_id: str, item_id: str, entry: dict[str, Any]) -> None:
        self.data.setdefault(section, {}).setdefault(guide_id, {})[item_id] = entry

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(self.path)


class ProgressError(RuntimeError):
    pass


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _plain(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value
