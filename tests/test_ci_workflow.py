"""The torch-upgrade gate's CI job (`.github/workflows/torch-upgrade-gate.yml`).

Its shell steps run here with bash, on this machine's torch, with a stand-in `gh` on PATH that logs its calls
and answers the comment lookup: a leg records its outcome, keeps one comment per leg (created once, then
updated; a clean leg posts nothing new), guards the comment's size, writes its summary.json even when pytest
refuses its command line, and fails exactly when the guides do. What only GitHub runs (checkout, setup-python's
pip cache, upload-artifact, the path filters, the fork guard, the CPU wheel index) is checked in the YAML."""

from __future__ import annotations

import json
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
MARKER = f"<!-- fsdp-readings torch-upgrade-gate: torch {RELEASE} -->"
POST = "Post the report on the pull request"


@pytest.fixture(scope="module")
def workflow() -> dict[Any, Any]:
    return yaml.safe_load(WORKFLOW.read_text())


@pytest.fixture(scope="module")
def job(workflow: dict[Any, Any]) -> dict[str, Any]:
    return workflow["jobs"]["gate"]


def step(job: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in job["steps"] if s.get("name") == name)


def run_step(job: dict[str, Any], name: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """A `run:` step as the runner runs it (bash -e), with the job's env and the machine's torch as the leg's.

    The step calls `python`: on the runner that is setup-python's interpreter, with the project installed. Here it
    is this test's own interpreter, put first on PATH, whether or not a venv is activated (README's test command
    runs the suite as `.venv/bin/python -m pytest`, with nothing activated)."""
    interpreter = str(Path(sys.executable).parent)
    path = f"{interpreter}{os.pathsep}{env.pop('PATH', os.environ.get('PATH', ''))}"
    merged = {**os.environ, **job["env"], "TORCH": RELEASE, "REPORTS": str(tmp_path / "reports"), **env, "PATH": path}
    merged["GITHUB_OUTPUT"] = str(tmp_path / "github_output")
    merged["RUNNER_TEMP"] = str(tmp_path)
    return subprocess.run(
        ["bash", "-e", "-c", step(job, name)["run"]], cwd=REPO, env=merged, capture_output=True, text=True, check=False
    )


def outputs(tmp_path: Path) -> dict[str, str]:
    lines = (tmp_path / "github_output").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines)


class StandInGh:
    """`gh` on PATH: logs each call's arguments (one per line, calls separated by `--`), and answers the comment
    lookup (`gh api repos/.../comments`) with the id of an existing comment, when one is set."""

    def __init__(self, root: Path) -> None:
        self.bin, self.log, self.existing = root / "bin", root / "gh.log", root / "gh-existing"
        self.bin.mkdir()
        script = self.bin / "gh"
        script.write_text(
            "#!/bin/sh\n"
            f'printf "%s\\n" "$@" -- >> "{self.log}"\n'
            f'if [ "$1" = api ] && [ "$2" != --method ] && [ -f "{self.existing}" ]; then cat "{self.existing}"; fi\n'
        )
        script.chmod(0o755)

    @property
    def path(self) -> str:
        return f"{self.bin}{os.pathsep}{os.environ['PATH']}"

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        text = self.log.read_text()
        return [call.strip("\n").split("\n") for call in text.split("--\n") if call.strip("\n")]

    def post(self, job: dict[str, Any], tmp_path: Path, outcome: str) -> subprocess.CompletedProcess[str]:
        env = {"PATH": self.path, "PR": "17", "GH_TOKEN": "t", "REPO": "o/r", "OUTCOME": outcome, "RUN_URL": "u"}
        return run_step(job, POST, tmp_path, **env)


def drifting_torch(tmp_path: Path) -> Path:
    """A torch whose `_prefetch_handle` changed: a tree holding the installed `_runtime_utils.py`, edited."""
    tree = make_tree(tmp_path / "site-packages")
    runtime = Path(torch.__file__).parent / "distributed" / "fsdp" / "_runtime_utils.py"
    tree.write("torch/distributed/fsdp/_runtime_utils.py", runtime.read_text())
    tree.edit("torch/distributed/fsdp/_runtime_utils.py", "handle._prefetched = True", "handle._prefetched = 1")
    return tree.root


def test_the_matrix_covers_every_version_the_lock_approves(job: dict[str, Any]):
    matrix = job["strategy"]["matrix"]["torch"]
    assert job["strategy"]["fail-fast"] is False
    releases = tuple(matrix)  # releases as the legs install them: 2.14.1 is not 2.14 (2.14.0)
    lock = Lock.load(REPO / "readings" / "anchors.lock")
    for entry in lock.entries.values():
        for source in entry.sources:
            assert in_matrix(source.approved_on, releases), f"{source.approved_on} not in the workflow's {matrix}"
    assert job["env"] == {"TORCH": "${{ matrix.torch }}", "REPORTS": "gate-reports", "FAIL_ON": "re-read"}


def test_readme_the_workflow_and_ci_name_the_releases_of_the_lock_s_matrix(job: dict[str, Any]):
    """One list of approved releases, said four times: the lock's matrix, the workflow's legs, README's sentence
    and `.ci/run`'s default legs (which the first command already covers on 2.13.0)."""
    import re

    matrix = list(Lock.load(REPO / "readings" / "anchors.lock").matrix)
    assert matrix and job["strategy"]["matrix"]["torch"] == matrix
    said = re.search(r"The guides are approved on torch ([0-9., and]+?):", (REPO / "README.md").read_text())
    assert said, "README's `Supported torch` paragraph names the approved releases"
    assert re.split(r", | and ", said.group(1)) == matrix
    legs = re.search(r"CI_TORCH_LEGS-([0-9. ]+)\}", (REPO / ".ci" / "run").read_text())
    assert legs and set(legs.group(1).split()) <= set(matrix)


def test_it_runs_only_when_torch_pins_or_guides_change_and_a_push_supersedes_the_last(workflow: dict[Any, Any]):
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert set(triggers["pull_request"]["paths"]) == {
        "pyproject.toml",  # the torch requirement
        "readings/**",  # the guides and anchors.lock
        "checks/**",  # the checks behind their claims
        ".github/workflows/torch-upgrade-gate.yml",  # the matrix of torch releases
    }
    assert workflow["concurrency"]["cancel-in-progress"] is True
    assert "github.event.pull_request.number" in workflow["concurrency"]["group"]


def test_pip_is_cached_and_the_install_asks_the_cpu_index_for_the_legs_torch(job: dict[str, Any]):
    setup = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/setup-python"))
    assert setup["with"]["cache"] == "pip" and setup["with"]["cache-dependency-path"] == "pyproject.toml"
    script = step(job, "Install torch (CPU wheel) and the project")["run"]
    assert 'pip install "torch==$TORCH" --index-url https://download.pytorch.org/whl/cpu' in script
    assert script.index("torch==") < script.index("-e '.[dev]'")  # torch first: nothing pulls a CUDA build


def test_forks_are_not_posted_to_and_a_leg_posts_whatever_its_outcome(job: dict[str, Any]):
    condition = step(job, POST)["if"]
    assert "github.event.pull_request.head.repo.full_name == github.repository" in condition  # not from a fork
    assert condition.startswith("always() && github.event_name == 'pull_request'")
    assert "steps.gate.outputs.outcome != ''" in condition  # a clean leg may still update its old comment
    assert step(job, "Keep the reports")["if"] == "always()"


def test_a_clean_leg_reports_and_posts_nothing_new(job: dict[str, Any], tmp_path: Path):
    ran = run_step(job, "Run the guides", tmp_path, PYTEST_ADDOPTS=NARROW)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert outputs(tmp_path) == {"status": "0", "outcome": "clean"}
    reports = tmp_path / "reports"
    assert (reports / f"torch-{RELEASE}.md").read_text().startswith("## fsdp-readings: clean")
    assert json.loads((reports / "summary.json").read_text())["outcome"] == "clean"
    gh = StandInGh(tmp_path)
    posted = gh.post(job, tmp_path, "clean")
    assert posted.returncode == 0, posted.stderr
    assert "nothing posted" in posted.stdout
    assert [call[:2] for call in gh.calls()] == [["api", "repos/o/r/issues/17/comments"]]  # looked, posted nothing


def test_a_drifting_leg_keeps_one_comment_and_fails(job: dict[str, Any], tmp_path: Path):
    addopts = f"{NARROW} --torch-source {drifting_torch(tmp_path)}"
    ran = run_step(job, "Run the guides", tmp_path, PYTEST_ADDOPTS=addopts)
    assert ran.returncode == 0  # the step records the status; the last step fails the leg
    assert outputs(tmp_path) == {"status": "6", "outcome": "re-read"}
    summary = (tmp_path / "reports" / "summary.md").read_text()
    # `prefetch`'s code changed under one of its notes: the lost note blocks its approval (finding 3b of the
    # [gate-report] issue: it used to be labelled "code changed").
    assert "**2 of 4 anchors to re-read** in 1 guide: 2 pattern lost." in summary
    assert (
        "- [ ] `00-format`: `prefetch` (pattern lost: 1 note, and code changed), `mark-prefetched` (pattern lost)"
        in summary
    )

    gh = StandInGh(tmp_path)
    first = gh.post(job, tmp_path, "re-read")
    assert first.returncode == 0, first.stderr
    body = tmp_path / f"comment-{RELEASE}.md"
    lookup, created = gh.calls()
    assert lookup[:2] == ["api", "repos/o/r/issues/17/comments"] and MARKER in " ".join(lookup)
    assert created == ["pr", "comment", "17", "--body-file", str(body)]
    text = body.read_text()
    assert text.startswith(f"{MARKER}\n## fsdp-readings: re-read") and text.rstrip().endswith(
        f"Run: u (artifact `drift-report-torch-{RELEASE}`)"
    )

    gh.existing.write_text("4242\n")  # the next push: the leg's comment exists, and is updated in place
    gh.log.unlink()
    second = gh.post(job, tmp_path, "re-read")
    assert second.returncode == 0, second.stderr
    assert gh.calls()[1] == ["api", "--method", "PATCH", "repos/o/r/issues/comments/4242", "-F", f"body=@{body}"]
    gh.log.unlink()
    assert gh.post(job, tmp_path, "clean").returncode == 0  # fixed later: the old comment is updated to clean
    assert gh.calls()[1][:3] == ["api", "--method", "PATCH"]

    failed = run_step(job, "Fail on the outcome", tmp_path, STATUS="6", OUTCOME="re-read")
    assert failed.returncode == 6 and "re-read (exit 6; 6 re-read only, 1 behaviour changed, 2 broken)" in failed.stdout


def test_a_report_too_long_for_a_comment_posts_a_pointer_to_the_artifact(job: dict[str, Any], tmp_path: Path):
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "summary.md").write_text("## fsdp-readings: behaviour changed\n" + "x" * 70_000 + "\n")
    gh = StandInGh(tmp_path)
    assert gh.post(job, tmp_path, "behaviour-changed").returncode == 0
    body = (tmp_path / f"comment-{RELEASE}.md").read_text()
    assert len(body.encode()) < 1000 and body.startswith(MARKER)
    assert f"## fsdp-readings: behaviour-changed · torch {RELEASE}" in body and "too long for a comment" in body


def test_a_command_line_pytest_refuses_still_leaves_a_broken_summary(job: dict[str, Any], tmp_path: Path):
    ran = run_step(job, "Run the guides", tmp_path, PYTEST_ADDOPTS="--no-such-option")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert outputs(tmp_path) == {"status": "4", "outcome": "broken"}
    summary = json.loads((tmp_path / "reports" / "summary.json").read_text())
    assert (summary["outcome"], summary["exit_code"]) == ("broken", 4)
    assert "pytest exited 4 before the gate wrote its report" in summary["broken"][0]
    assert (tmp_path / "reports" / "summary.md").read_text().startswith(f"## fsdp-readings: broken (torch {RELEASE})")
