"""The torch-upgrade gate's CI job (`.github/workflows/torch-upgrade-gate.yml`): its matrix covers the lock, and
its shell steps, run here with bash on this machine's torch, produce and post the report and fail the leg exactly
when the guides do. What cannot run here is GitHub's own actions (checkout, setup-python, upload-artifact) and
the CPU wheel index."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from packaging.version import Version

from reader.gate.lock import Lock, in_matrix
from tests.reader.reader_support import make_tree

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / ".github" / "workflows" / "torch-upgrade-gate.yml"
RELEASE = Version(torch.__version__).public
NARROW = '-k "format and anchor"'  # one guide's anchors: the step's command line, not the whole suite


@pytest.fixture(scope="module")
def job() -> dict[str, Any]:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"]["gate"]


def step(job: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in job["steps"] if s.get("name") == name)


def run_step(job: dict[str, Any], name: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """A `run:` step as the runner runs it (bash -e), with the job's env and the machine's torch as the leg's.

    The step calls `python`: on the runner that is setup-python's interpreter, with the project installed. Here it
    is this test's own interpreter, put first on PATH, whether or not a venv is activated (README's test command
    runs the suite as `.venv/bin/python -m pytest`, with nothing activated)."""
    interpreter = str(Path(sys.executable).parent)
    path = f"{interpreter}{os.pathsep}{env.pop('PATH', os.environ.get('PATH', ''))}"
    merged = {**os.environ, "TORCH": RELEASE, "REPORTS": str(tmp_path / "reports"), **env, "PATH": path}
    merged["GITHUB_OUTPUT"] = str(tmp_path / "github_output")
    return subprocess.run(
        ["bash", "-e", "-c", step(job, name)["run"]], cwd=REPO, env=merged, capture_output=True, text=True, check=False
    )


def test_the_matrix_covers_every_version_the_lock_approves(job: dict[str, Any]):
    matrix = job["strategy"]["matrix"]["torch"]
    assert job["strategy"]["fail-fast"] is False
    releases = tuple(".".join(v.split(".")[:2]) for v in matrix)
    lock = Lock.load(REPO / "readings" / "anchors.lock")
    for entry in lock.entries.values():
        for source in entry.sources:
            assert in_matrix(source.approved_on, releases), f"{source.approved_on} not in the workflow's {matrix}"
    assert job["env"] == {"TORCH": "${{ matrix.torch }}", "REPORTS": "gate-reports"}


def test_a_clean_leg_reports_and_does_not_post(job: dict[str, Any], tmp_path: Path):
    ran = run_step(job, "Run the guides", tmp_path, PYTEST_ADDOPTS=NARROW)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert (tmp_path / "github_output").read_text() == "status=0\n"
    assert (tmp_path / "reports" / f"torch-{RELEASE}.md").read_text().startswith("## fsdp-readings: clean")
    assert step(job, "Post the report on the pull request")["if"] == (
        "github.event_name == 'pull_request' && steps.gate.outputs.status != '0'"
    )


def test_a_drifting_leg_posts_its_report_and_fails(job: dict[str, Any], tmp_path: Path):
    # A torch whose `_prefetch_handle` changed: a tree holding the installed `_runtime_utils.py`, edited.
    tree = make_tree(tmp_path / "site-packages")
    runtime = Path(torch.__file__).parent / "distributed" / "fsdp" / "_runtime_utils.py"
    tree.write("torch/distributed/fsdp/_runtime_utils.py", runtime.read_text())
    tree.edit("torch/distributed/fsdp/_runtime_utils.py", "handle._prefetched = True", "handle._prefetched = 1")
    ran = run_step(job, "Run the guides", tmp_path, PYTEST_ADDOPTS=f"{NARROW} --torch-source {tree.root}")
    assert ran.returncode == 0  # the step records the status; the last step fails the leg
    assert (tmp_path / "github_output").read_text() == "status=1\n"
    report = (tmp_path / "reports" / f"torch-{RELEASE}.md").read_text()
    assert "**2 of 4 anchors to re-read** in 1 guide: 1 pattern lost, 1 code changed." in report
    assert "- [ ] `00-format`: `prefetch` (code changed), `mark-prefetched` (pattern lost)" in report

    fake_gh = tmp_path / "bin" / "gh"
    fake_gh.parent.mkdir()
    fake_gh.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "gh-args"}\n')
    fake_gh.chmod(0o755)
    path = f"{fake_gh.parent}:{os.environ['PATH']}"
    posted = run_step(job, "Post the report on the pull request", tmp_path, PATH=path, PR="17", GH_TOKEN="t")
    assert posted.returncode == 0, posted.stderr
    args = (tmp_path / "gh-args").read_text().split("\n")[:-1]
    assert args == ["pr", "comment", "17", "--body-file", str(tmp_path / "reports" / f"torch-{RELEASE}.md")]

    failed = run_step(job, "Fail on drift, a failed claim or broken input", tmp_path, STATUS="1")
    assert failed.returncode == 1 and "exit 1: 1 drift or a failed claim" in failed.stdout


def test_the_install_step_asks_the_cpu_index_for_the_legs_torch(job: dict[str, Any]):
    script = step(job, "Install torch (CPU wheel) and the project")["run"]
    assert 'pip install "torch==$TORCH" --index-url https://download.pytorch.org/whl/cpu' in script
    assert script.index("torch==") < script.index("-e '.[dev]'")  # torch first: nothing pulls a CUDA build
