"""`.ci/run` runs README's quick start exactly as README writes it: its two commands, in order, with nothing
activated, then style checks, and only a failing command (not pytest's "no tests ran", 5) fails the run.

The real commands take twenty minutes, so `.ci/run` itself runs here on a scratch checkout whose README's quick
start holds two stand-in commands: they make a ``.venv`` whose ``python`` and ``ruff`` only log their calls.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STUB = '#!/bin/sh\\necho \\"$(basename $0) $*\\" >> calls.log\\n'
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


def _checkout(tmp_path: Path, second: str) -> Path:
    checkout = tmp_path / "checkout"
    (checkout / ".ci").mkdir(parents=True)
    for name in ("run", "quick_start.py"):
        shutil.copy2(REPO / ".ci" / name, checkout / ".ci" / name)
    readme = f"# x\n\n## Quick start\n\n```bash\n{MAKE_VENV} && echo first >> calls.log\n{second}\n```\n"
    (checkout / "README.md").write_text(readme)
    return checkout


def _run(checkout: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PATH"] = "/usr/bin:/bin"  # no venv activated: README's commands must not need one
    return subprocess.run(
        ["bash", str(checkout / ".ci" / "run")], cwd=checkout, env=env, capture_output=True, text=True, check=False
    )


def test_ci_runs_the_two_commands_in_order_then_style_with_nothing_activated(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path, "echo second >> calls.log")
    ran = _run(checkout)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    calls = (checkout / "calls.log").read_text().splitlines()
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
