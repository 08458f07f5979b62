"""`fsdp-readings list` says whether the installed torch is an approved release: one on which every guide was
re-read and approved (the lock's per-guide records), and which releases are."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reader.commands.guides import _release_status
from reader.gate.lock import GuideRecord, Lock

GUIDES = ["01-a", "02-b"]


@dataclass
class _Workspace:  # the two things the status reads: the lock and the installed torch's version string
    lock: Lock
    torch_version: str


def _lock(tmp_path: Path, approved: dict[str, list[str]]) -> Lock:
    guides = {g: {r: GuideRecord(held=1) for r in releases} for g, releases in approved.items()}
    return Lock(path=tmp_path / "anchors.lock", guides=guides)


def test_a_release_every_guide_is_approved_on_is_approved_whatever_its_build_tag(tmp_path: Path) -> None:
    lock = _lock(tmp_path, {"01-a": ["2.13.0", "2.15.0"], "02-b": ["2.15.0", "2.13.0"]})
    text = _release_status(_Workspace(lock, "2.15.0+cu132"), GUIDES).plain  # type: ignore[arg-type]
    assert text.startswith("torch 2.15.0 is an approved release")
    assert "Approved releases: 2.13.0, 2.15.0." in text


def test_a_release_one_guide_lacks_is_not_approved_and_the_count_is_given(tmp_path: Path) -> None:
    lock = _lock(tmp_path, {"01-a": ["2.13.0", "2.15.0"], "02-b": ["2.13.0"]})
    text = _release_status(_Workspace(lock, "2.15.0"), GUIDES).plain  # type: ignore[arg-type]
    assert text.startswith("torch 2.15.0 is not an approved release (1 of 2 guides approved on it)")
    assert "Approved releases: 2.13.0." in text  # 2.15.0 is not on every guide


def test_an_unread_release_names_the_approved_ones_and_the_drift_command(tmp_path: Path) -> None:
    lock = _lock(tmp_path, {"01-a": ["2.13.0"], "02-b": ["2.13.0"]})
    text = _release_status(_Workspace(lock, "2.16.0.dev20261201"), GUIDES).plain  # type: ignore[arg-type]
    assert "is not an approved release (no guide approved on it)" in text
    assert "Approved releases: 2.13.0." in text and "fsdp-readings drift" in text


def test_the_real_lock_approves_the_installed_torch(capsys) -> None:
    """The CI legs run on releases of the lock's matrix: `list` says so on each of them."""
    from reader.commands.app import main

    readings = Path(__file__).resolve().parents[2] / "readings"
    assert main(["--readings", str(readings), "list"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "is an approved release: every guide was re-read and approved on it" in out
