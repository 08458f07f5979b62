"""``fsdp-readings upgrade-gate``: what each leg runs, where its venv may live, and the side-by-side summary.

The real legs install multi-GB torch builds, so they run outside CI (README, "Gating a torch upgrade"); here the
plan, the commands and the summary are checked, and a leg runs for real against a stand-in venv whose python is
this one (torch 2.13.0) with the pytest run narrowed to one guide's anchors.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from reader.commands.app import main
from reader.gate.upgrade_gate import Leg, commands, plan, summarize

REPO = Path(__file__).resolve().parents[2]


def test_venvs_inside_the_project_are_refused(capsys):
    assert main(["upgrade-gate", "2.15.0", "--venvs", str(REPO / "venvs"), "--dry-run"]) == 2
    assert "is inside the project" in capsys.readouterr().out
    with pytest.raises(ValueError, match="not a torch release"):
        plan(["2.x"], Path("/tmp/gate"), [], REPO)
    with pytest.raises(ValueError, match="RELEASE=PATH to an existing wheel"):
        plan(["2.15.0"], Path("/tmp/gate"), ["2.15.0=/nonexistent.whl"], REPO)


def test_a_leg_builds_installs_then_runs_the_guides_and_reuses_a_venv_that_holds_the_release(tmp_path: Path):
    wheel = tmp_path / "torch-2.15.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"")
    (leg,) = plan(["2.15.0"], tmp_path / "venvs", [f"2.15.0={wheel}"], REPO)
    assert leg == Leg("2.15.0", tmp_path / "venvs" / "torch-2.15.0", wheel)
    python = str(leg.python)
    report = str(tmp_path / "out" / "torch-2.15.0.json")
    fresh = commands(leg, REPO, tmp_path / "out", ["-k", "anchor"], installed=None)
    assert fresh == [
        [sys.executable, "-m", "venv", str(leg.venv)],
        [python, "-m", "pip", "install", "--quiet", str(wheel)],
        [python, "-m", "pip", "install", "--quiet", "-e", f"{REPO}[dev]"],
        [python, "-m", "pytest", "readings/", "--drift-report", report, "-q", "-k", "anchor"],
    ]
    assert commands(leg, REPO, tmp_path / "out", [], installed="2.15.0+cu132") == [fresh[-1][:-2]]
    assert commands(leg, REPO, tmp_path / "out", [], installed="2.14.1+cu130")[0] == fresh[1]  # reinstall torch


def report(version: str, anchors: list[tuple[str, str]], claims: list[tuple[str, str, str | None]]) -> dict:
    return {
        "torch": {"version": version},
        "exit_code": 1 if any(o == "failed" for _, o in anchors) or any(o == "failed" for _, o, _ in claims) else 0,
        "guides": [
            {
                "id": "16-fsdp2",
                "anchors": [
                    {"name": n, "outcome": o, "drift": "code changed" if o == "failed" else "unchanged"}
                    for n, o in anchors
                ],
                "claims": [
                    {"id": c, "outcome": o, "reason": r, "message": "rank 0: shard rows [3, 3, 3, 0]"}
                    for c, o, r in claims
                ],
            }
        ],
    }


def test_the_summary_puts_the_legs_side_by_side(tmp_path: Path):
    (tmp_path / "torch-2.14.1.json").write_text(
        json.dumps(report("2.14.1+cu130", [("a", "passed"), ("b", "passed")], [("x", "passed", None)]))
    )
    (tmp_path / "torch-2.15.0.json").write_text(
        json.dumps(
            report(
                "2.15.0+cu132",
                [("a", "failed"), ("b", "passed")],
                [("x", "failed", "shard-rows"), ("y", "skipped", None)],
            )
        )
    )
    text = summarize([tmp_path / "torch-2.14.1.json", tmp_path / "torch-2.15.0.json", tmp_path / "torch-2.16.0.json"])
    assert "| 2.14.1+cu130 | 0 | 0 of 2 | — | 1 of 1 | 0 | 0 |" in text
    assert "| 2.15.0+cu132 | 1 | 1 of 2 | 1 code changed | 0 of 2 | 1 | 1 |" in text
    assert "| torch-2.16.0 | 2 | no report | | | | |" in text
    assert "- anchor `16-fsdp2/a`: code changed" in text
    assert "- claim `16-fsdp2/x` failed: `shard-rows` — rank 0: shard rows [3, 3, 3, 0]" in text


def test_a_real_leg_writes_its_reports(tmp_path: Path, capsys):
    """A stand-in venv (this python, which holds 2.13.0) is reused: no build, only the guides run."""
    import torch

    release = torch.__version__.split("+")[0]
    venv = tmp_path / "venvs" / f"torch-{release}"
    (venv / "bin").mkdir(parents=True)
    stand_in = venv / "bin" / "python"
    stand_in.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # a symlink would lose this venv's packages
    stand_in.chmod(0o755)
    out = tmp_path / "reports"
    argv = ["upgrade-gate", release, "--venvs", str(tmp_path / "venvs"), "--out", str(out)]
    code = main([*argv, "--pytest-arg=-k", "--pytest-arg=format and anchor"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "pip install" not in printed  # reused
    data = json.loads((out / f"torch-{release}.json").read_text())
    assert data["torch"]["version"] == torch.__version__ and data["exit_code"] == 0
    assert (out / f"torch-{release}.md").read_text().startswith("## fsdp-readings: clean")
    assert f"| {torch.__version__} | 0 | 0 of " in (out / "summary.md").read_text()


def test_releases_are_compared_as_versions(tmp_path: Path, capsys):
    """`2.15`, `2.15.0` and the `2.15.0+cu132` a CUDA build reports are one release: one leg, one venv, no
    reinstall, and no "the venv holds 2.15.0+cu132, not 2.15"."""
    legs = plan(["2.15", "2.15.0", "2.14.1+cu130"], tmp_path / "venvs", [], REPO)
    assert [(leg.release, leg.venv.name) for leg in legs] == [("2.15.0", "torch-2.15.0"), ("2.14.1", "torch-2.14.1")]
    (leg,) = plan(["2.15"], tmp_path / "venvs", [], REPO)
    assert commands(leg, REPO, tmp_path / "out", [], installed="2.15.0+cu132")[0][2] == "pytest"  # reused
    assert "torch==2.15.0" in commands(leg, REPO, tmp_path / "out", [], installed=None)[1]
    # A venv whose build step installed 2.15.0+cu132 for `2.15` is accepted, not refused as another release.
    (leg.venv / "bin").mkdir(parents=True)
    leg.python.write_text('#!/bin/sh\nif [ "$1" = -c ]; then echo 2.15.0+cu132; fi\nexit 0\n')
    leg.python.chmod(0o755)
    code = main(["upgrade-gate", "2.15", "--venvs", str(tmp_path / "venvs"), "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert "not 2.15" not in printed and "holds torch" not in printed
    assert code == 0 and "| torch-2.15.0 | 0 | no report |" in printed  # the stand-in ran, wrote no report
