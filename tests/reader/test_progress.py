"""A learner's record (`reader.claims.progress`): honest scores, reveals, and claim results by torch."""

from __future__ import annotations

import json
from pathlib import Path

from reader.claims.progress import Progress

GUIDE = "02-root-and-lazy-init"


def test_a_score_counts_first_answers_and_a_retake_cannot_raise_it(tmp_path: Path) -> None:
    progress = Progress(tmp_path / "progress.json")
    progress.record(GUIDE, "a", "wrong", False, 1)
    progress.record(GUIDE, "b", "right", True, 2)
    assert progress.score(GUIDE) == (1, 2)
    progress.record(GUIDE, "a", "right now", True, 1)  # after its reveal: practice
    assert progress.score(GUIDE) == (1, 2)
    assert progress.data["predict"][GUIDE]["a"]["answer"] == "right now"  # the latest attempt is still kept
    progress.record(GUIDE, "b", "wrong now", False, 2)  # a worse retake does not lower it either
    assert progress.score(GUIDE) == (1, 2)


def test_an_answer_seen_before_answering_never_scores(tmp_path: Path) -> None:
    """`predict --no-run` and `show --answers` reveal the guide's answers: answering afterwards is not honest."""
    progress = Progress(tmp_path / "progress.json")
    progress.reveal(GUIDE, ["a", "b"])
    progress.record(GUIDE, "a", "right", True, 1)
    assert progress.score(GUIDE) == (0, 1)
    assert progress.revealed(GUIDE, "b") and not progress.revealed(GUIDE, "c")
    assert not progress.revealed(GUIDE, "a", "exercises")  # questions and exercises are revealed apart


def test_text_answers_are_kept_but_not_scored(tmp_path: Path) -> None:
    progress = Progress(tmp_path / "progress.json")
    progress.record(GUIDE, "why", "because", None, None)
    assert progress.score(GUIDE) == (0, 0)


def test_claim_results_are_kept_per_torch(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    progress = Progress(path)
    progress.record_claim(GUIDE, "x", "passed", "2.13.0+cpu")
    progress.record_claim(GUIDE, "y", "failed", "2.15.0+cu132")
    progress.save()
    again = Progress(path)
    assert again.claims(GUIDE) == {"x": "passed", "y": "failed"}
    assert again.claims(GUIDE, "2.13.0+cpu") == {"x": "passed"}


def test_a_file_written_before_honest_scores_keeps_its_attempts(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    old = {"predict": {GUIDE: {"a": {"answer": "1", "correct": True, "observed": 1, "at": "2026-01-01T00:00:00"}}}}
    path.write_text(json.dumps(old))
    progress = Progress(path)
    assert progress.score(GUIDE) == (1, 1)
    progress.record(GUIDE, "a", "2", False, 1)  # a retake of a question answered before
    assert progress.score(GUIDE) == (1, 1)
