"""`.ci/run` runs README's quick start exactly as README writes it: its two commands, in order, with nothing
activated, then style checks, and only a failing command (not pytest's "no tests ran", 5) fails the run.

The real commands take twenty minutes, so `.ci/run` itself runs here on a scratch checkout whose README's quick
start holds two stand-in commands: they make a ``.venv`` whose ``python`` and ``ruff`` only log their calls, to one
log outside the checkout (``$CALLS``), so that the torch legs, which run in a copy, log there too.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STUB = '#!/bin/sh\\necho \\"$(basename $0) $*\\" >> \\"$CALLS\\"\\n'
MAKE_VENV = (
    f"mkdir -p .venv/bin && for t in python ruff; do printf '{STUB}' > .venv/bin/$t; chmod +x .venv/bin/$t; done"
)


def _quick_start() -> object:
    spec = importlib.util.spec_from_file_location("quick_start", REPO / ".ci" / "quick_start.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_quick_start_is_two_commands_with_torch_installed_first() -> None:
    install, tests = _quick_start().commands((REPO / "README.md").read_text(encoding="utf-8"))
    assert install.index("pip install torch==2.13.0") < install.index("pip install -e '.[dev]'")
    assert install.startswith("python3 -m venv .venv") and install.endswith(".venv/bin/python -m pytest readings/")
    assert tests == ".venv/bin/python -m pytest --slow"
    assert "activate" not in install + tests  # nothing a newcomer would have to do by hand


def test_a_readme_without_its_quick_start_is_named() -> None:
    commands = _quick_start().commands
    with pytest.raises(ValueError, match="no `## Quick start` section"):
        commands("# Title\n")
    with pytest.raises(ValueError, match="has no ```bash block"):
        commands("## Quick start\n\ntext only\n")
    with pytest.raises(ValueError, match="commands only"):
        commands("## Quick start\n\n```bash\n# a comment\nls\n```\n")


def _checkout(tmp_path: Path, second: str, first: str = 'echo first >> "$CALLS"') -> Path:
    checkout = tmp_path / "checkout"
    (checkout / ".ci").mkdir(parents=True)
    for name in ("run", "quick_start.py"):
        shutil.copy2(REPO / ".ci" / name, checkout / ".ci" / name)
    readme = f"# x\n\n## Quick start\n\n```bash\n{MAKE_VENV} && {first}\n{second}\n```\n"
    (checkout / "README.md").write_text(readme)
    return checkout


def _run(checkout: Path, legs: str | None = "") -> subprocess.CompletedProcess[str]:
    """`.ci/run` with nothing activated; ``legs`` is CI_TORCH_LEGS (None: unset, the default legs)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PIP_CONSTRAINT", "CI_TORCH_LEGS")}
    env["PATH"] = "/usr/bin:/bin"  # no venv activated: README's commands must not need one
    env["CALLS"] = str(checkout.parent / "calls.log")
    env["TMPDIR"] = str(checkout.parent / "tmp")
    Path(env["TMPDIR"]).mkdir(exist_ok=True)
    if legs is not None:
        env["CI_TORCH_LEGS"] = legs
    return subprocess.run(
        ["bash", str(checkout / ".ci" / "run")], cwd=checkout, env=env, capture_output=True, text=True, check=False
    )


def test_ci_runs_the_two_commands_in_order_then_style_with_nothing_activated(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path, 'echo second >> "$CALLS"')
    ran = _run(checkout)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    calls = (checkout.parent / "calls.log").read_text().splitlines()
    assert calls[0] == "first" and calls[-1] == "second"
    assert calls[1].startswith("python -c import torch")
    assert calls[2:4] == ["ruff check .", "ruff format --check ."]


def test_no_tests_ran_is_not_a_failure_but_a_failing_command_is(tmp_path: Path) -> None:
    assert _run(_checkout(tmp_path / "five", "exit 5")).returncode == 0
    failed = _run(_checkout(tmp_path / "one", "exit 1"))
    assert failed.returncode == 1


def test_a_checkout_that_already_has_a_venv_is_refused(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path, "true")
    (checkout / ".venv").mkdir()
    ran = _run(checkout)
    assert ran.returncode == 2 and "CI runs on a clean clone" in ran.stderr


# The stand-in first command logs the torch it would install, the constraint it runs under and where it runs.
PINNED = 'pin=torch==2.13.0 && echo "first $pin PIP_CONSTRAINT=${PIP_CONSTRAINT-unset} $PWD" >> "$CALLS"'


def _clean_clone(tmp_path: Path, first: str = PINNED) -> Path:
    checkout = _checkout(tmp_path, 'echo "second $PWD" >> "$CALLS"', first)
    (checkout / ".gitignore").write_text(".venv/\n")
    (checkout / "untracked.txt").write_text("a file a leg must carry\n")
    git = ["git", "-c", "user.name=ci", "-c", "user.email=ci@example.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=checkout, check=True)
    subprocess.run([*git, "add", ".ci", "README.md", ".gitignore"], cwd=checkout, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=checkout, check=True)
    return checkout


def test_the_default_leg_reruns_the_first_command_on_torch_2_15_in_a_copy_that_is_removed(tmp_path: Path) -> None:
    checkout = _clean_clone(tmp_path)
    ran = _run(checkout, legs=None)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls[0] == f"first torch==2.13.0 PIP_CONSTRAINT=unset {checkout}"
    second = next(i for i, c in enumerate(calls) if c.startswith("second "))
    assert calls[second] == f"second {checkout}"
    leg = calls[second + 1].split()
    assert leg[:3] == ["first", "torch==2.15.0", "PIP_CONSTRAINT=/dev/null"]  # only the pin changed, cap lifted
    copy = Path(leg[3])
    assert copy != checkout and checkout not in copy.parents
    assert calls[second + 2].startswith("python -c import sys, torch")  # the installed release is checked
    assert not copy.exists() and not any((tmp_path / "tmp").iterdir())  # the copy and its venv are gone


def test_a_leg_carries_tracked_and_untracked_files_but_not_the_venv(tmp_path: Path) -> None:
    # the run on the checkout leaves a mark in its .venv; the leg lists its copy and the copy's .venv
    mark = "case $pin in *2.13.0) touch .venv/from-the-checkout;; esac"
    listing = 'echo "$(ls -a | tr "\\n" " ") venv: $(ls .venv/bin .venv | tr "\\n" " ")" >> "$CALLS"'
    first = f"{PINNED} && {mark} && {listing}"
    checkout = _clean_clone(tmp_path, first)
    ran = _run(checkout, legs="2.14.1")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    leg = next(i for i, c in enumerate(calls) if c.startswith("first torch==2.14.1"))
    listed = calls[leg + 1].split()
    assert {".ci", "README.md", ".gitignore", "untracked.txt"} <= set(listed)
    assert ".git" not in listed  # a copy of the files, not of the clone
    venv = listed[listed.index("venv:") + 1 :]
    assert "python" in venv and "from-the-checkout" not in venv  # the leg made its own .venv; none was carried


def test_a_failing_leg_fails_the_run_and_its_copy_is_still_removed(tmp_path: Path) -> None:
    first = PINNED.replace(' >> "$CALLS"', ' >> "$CALLS" && case $pin in *2.15.0) exit 3;; esac')
    checkout = _clean_clone(tmp_path, first)
    ran = _run(checkout, legs=None)
    assert ran.returncode == 3
    calls = (tmp_path / "calls.log").read_text().splitlines()
    copy = Path(calls[-1].split()[3])
    assert calls[-1].startswith("first torch==2.15.0") and not copy.exists()
    assert not any((tmp_path / "tmp").iterdir())


def test_a_leg_on_a_readme_that_pins_no_torch_is_refused(tmp_path: Path) -> None:
    checkout = _clean_clone(tmp_path, 'echo "first" >> "$CALLS"')
    ran = _run(checkout, legs="2.15.0")
    assert ran.returncode == 2 and "pins no torch==X" in ran.stderr
