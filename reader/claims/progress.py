"""A learner's record, kept in the user's data directory (never in the repository): predict and exercise scores,
what was revealed to them, and the last result of every claim that ran.

One JSON file, ``progress.json``, under platformdirs' user data dir for ``fsdp-readings`` (``~/.local/share/
fsdp-readings`` on Linux), or under ``$FSDP_READINGS_DATA_DIR`` when set (tests, shared machines). Sections, each
guide id → item id → an entry:

- ``predict`` and ``exercises``: the latest attempt (what was typed, whether it was right, what the run showed),
  and ``honest``: whether the item's honest attempt (its first, made before its answer was seen) was right. A score
  counts honest attempts only: once an answer has been seen (after answering, with ``predict --no-run``, or with
  ``show --answers``) a retake is practice, and cannot raise the score.
- ``revealed``: when each question's answer (or each exercise's solution) was first shown.
- ``claims``: the last result of each claim (``pytest readings/``, ``check``, ``predict`` and the views all record
  it) with the torch it ran on, so that ``list`` reports only results of the installed torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from platformdirs import user_data_dir

from reader.claims.status import Status
from reader.source.files import write_atomic

ENV = "FSDP_READINGS_DATA_DIR"
Section = Literal["predict", "exercises"]


def data_dir() -> Path:
    return Path(os.environ.get(ENV) or user_data_dir("fsdp-readings", appauthor=False))


@dataclass(frozen=True)
class Attempt:
    answer: str
    correct: bool | None  # None: a text answer, compared by the learner, not scored
    observed: Any
    at: str


class Progress:
    """The progress file, read once and written whole (atomically)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else data_dir() / "progress.json"
        try:
            self.data: dict[str, dict[str, dict[str, Any]]] = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            self.data = {}
        except (OSError, ValueError) as exc:
            raise ProgressError(f"{self.path}: unreadable progress file ({exc}); move it away to start afresh") from exc

    # -- predict questions and exercises --------------------------------------------------------------------------

    def record(self, guide_id: str, question_id: str, answer: str, correct: bool | None, observed: Any) -> None:
        """A predict attempt; its answer is revealed by it (the reveal follows every answer)."""
        self._attempt("predict", guide_id, question_id, Attempt(answer, correct, _plain(observed), _now()))

    def record_exercise(self, guide_id: str, exercise_id: str, answer: str, correct: bool, observed: str) -> None:
        self._attempt("exercises", guide_id, exercise_id, Attempt(answer, correct, observed, _now()))

    def reveal(self, guide_id: str, item_ids: list[str], section: Section = "predict") -> None:
        """Mark answers as seen (``show --answers``): later attempts of these items are practice."""
        seen = self.data.setdefault("revealed", {}).setdefault(f"{section}/{guide_id}", {})
        for item_id in item_ids:
            seen.setdefault(item_id, _now())

    def revealed(self, guide_id: str, item_id: str, section: Section = "predict") -> bool:
        return item_id in self.data.get("revealed", {}).get(f"{section}/{guide_id}", {})

    def _attempt(self, section: Section, guide_id: str, item_id: str, attempt: Attempt) -> None:
        entries = self.data.setdefault(section, {}).setdefault(guide_id, {})
        before = entries.get(item_id, {})
        if "honest" in before:  # a retake: practice, the honest result stays
            honest = before["honest"]
        elif before:  # written before scores kept their honest attempt: its one attempt was that
            honest = before.get("correct")
        elif attempt.correct is None:
            honest = None
        else:  # the first attempt counts if it was made before the answer was seen
            honest = attempt.correct and not self.revealed(guide_id, item_id, section)
        entries[item_id] = {**asdict(attempt), "honest": honest}
        self.reveal(guide_id, [item_id], section)

    def score(self, guide_id: str, section: Section = "predict") -> tuple[int, int]:
        """(right, scored): items whose honest attempt was right, of the items attempted (text answers are not
        scored)."""
        attempts = self.data.get(section, {}).get(guide_id, {}).values()
        scored = [a for a in attempts if a.get("correct") is not None]
        return sum(1 for a in scored if a.get("honest", a.get("correct"))), len(scored)

    # -- claims ---------------------------------------------------------------------------------------------------

    def record_claim(self, guide_id: str, claim_id: str, result: Status, torch: str | None = None) -> None:
        self._put("claims", guide_id, claim_id, {"result": str(result), "torch": torch, "at": _now()})

    def claims(self, guide_id: str, torch: str | None = None) -> dict[str, Status]:
        """The last result of each claim (passed / failed / skipped / xfailed / xpassed); with ``torch``, only the
        results recorded on that torch. A result this version does not know is left out."""
        entries = self.data.get("claims", {}).get(guide_id, {})
        here = {cid: e for cid, e in entries.items() if torch is None or e.get("torch") == torch}
        found = {cid: Status.named(e.get("result")) for cid, e in here.items()}
        return {cid: status for cid, status in found.items() if status is not None}

    def _put(self, section: str, guide_id: str, item_id: str, entry: dict[str, Any]) -> None:
        self.data.setdefault(section, {}).setdefault(guide_id, {})[item_id] = entry

    def save(self) -> None:
        write_atomic(self.path, json.dumps(self.data, indent=2, sort_keys=True) + "\n")


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
