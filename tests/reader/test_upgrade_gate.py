"""``fsdp-readings upgrade-gate``: what each leg runs, where its venv may live, the legs' outcomes and summaries.

The real legs install torch builds of several GB, so they run outside CI (README, "Gating a torch upgrade"); here
the plan, the commands and the summaries are checked; a leg runs for real against a stand-in venv whose python is
this one (torch 2.13.0) with the pytest run narrowed to one guide's anchors; and ``--index-url`` installs a small
stand-in torch wheel from a local file index with a real pip (no CPU index is reachable from here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from reader.commands.app import main
from reader.gate.upgrade_gate import Leg, Setup, commands, installed_torch, plan, summarize

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
    report = str(tmp_path / "out" / "torch-2.15.0" / "torch-2.15.0.json")  # each leg in a folder of its own
    setup = Setup(REPO, tmp_path / "out", ["-k", "anchor"], index_url="https://download.pytorch.org/whl/cpu")
    fresh = commands(leg, setup, installed=None)
    assert fresh == [
        [sys.executable, "-m", "venv", str(leg.venv)],
        [python, "-m", "pip", "install", "--quiet", str(wheel)],  # a wheel file: no index asked
        [python, "-m", "pip", "install", "--quiet", "-e", f"{REPO}[dev]"],
        [python, "-m", "pytest", "readings/", "--drift-report", report, "--fail-on", "re-read", "-q", "-k", "anchor"],
    ]
    plain = Setup(REPO, tmp_path / "out", [])
    assert commands(leg, plain, installed="2.15.0+cu132") == [fresh[-1][:-2]]
    assert commands(leg, plain, installed="2.14.1+cu130")[0] == fresh[1]  # reinstall torch


def test_index_url_installs_torch_from_that_index_and_the_rest_from_pips_own(tmp_path: Path, capsys):
    (leg,) = plan(["2.15.0"], tmp_path / "venvs", [], REPO)
    steps = commands(leg, Setup(REPO, tmp_path / "out", [], index_url="file:///idx/simple"), installed=None)
    assert steps[1][-4:] == ["--quiet", "torch==2.15.0", "--index-url", "file:///idx/simple"]
    assert "--index-url" not in steps[2]  # the project's requirements: not on a CPU index
    argv = ["upgrade-gate", "2.15", "--venvs", str(tmp_path / "venvs"), "--index-url", "file:///idx/simple"]
    assert main([*argv, "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "-m pip install --quiet torch==2.15.0 --index-url file:///idx/simple" in printed
    assert not (tmp_path / "venvs").exists()  # a dry run builds nothing


def stand_in_torch(index: Path, version: str = "2.15.0+cpu") -> str:
    """A PEP 503 file index (``index/simple/torch/``) holding a tiny wheel named torch; returns its URL."""
    folder = index / "simple" / "torch"
    folder.mkdir(parents=True)
    name = f"torch-{version}-py3-none-any.whl"
    dist = f"torch-{version}.dist-info"
    files = {
        "torch/__init__.py": f"__version__ = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: a test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{path},,\n" for path in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(folder / name, "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
    quoted = name.replace("+", "%2B")
    (folder / "index.html").write_text(f'<html><body><a href="{quoted}">{name}</a></body></html>\n')
    (index / "simple" / "index.html").write_text('<html><body><a href="torch/">torch</a></body></html>\n')
    return (index / "simple").as_uri()


def test_index_url_really_installs_from_a_local_file_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The leg's own venv and torch steps, run for real: pip finds `torch==2.15.0` on the index given, and only
    there (this machine's pip configuration, its extra indexes and wheel folders, are switched off)."""
    url = stand_in_torch(tmp_path / "index")
    for name in [n for n in os.environ if n.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    (leg,) = plan(["2.15.0"], tmp_path / "venvs", [], REPO)
    venv, torch, _project, _tests = commands(leg, Setup(REPO, tmp_path / "out", [], index_url=url), installed=None)
    for step in (venv, torch):
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    assert installed_torch(leg) == "2.15.0+cpu"


def stand_in_venv(venv: Path, *, pip_fails: bool = False, pytest_code: int = 4) -> Path:
    """A venv whose python logs its arguments: `-c` answers the torch version once `pip install torch==` ran,
    pip succeeds (or fails for torch), and pytest exits ``pytest_code`` without writing any report."""
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    log, installed = venv / "calls.log", venv / "torch-installed"
    python.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> "{log}"\n'
        f'if [ "$1" = -c ]; then [ -f "{installed}" ] && echo 2.15.0+cpu && exit 0; exit 1; fi\n'
        f'if [ "$2" = pip ] && [ "$5" = torch==2.15.0 ]; then {"exit 1" if pip_fails else f"touch {installed}"}; fi\n'
        f'if [ "$2" = pytest ]; then exit {pytest_code}; fi\n'
        "exit 0\n"
    )
    python.chmod(0o755)
    return log


def test_a_leg_whose_torch_will_not_install_or_whose_pytest_stops_is_broken_with_a_summary(tmp_path: Path, capsys):
    venvs, out = tmp_path / "venvs", tmp_path / "out"
    calls = stand_in_venv(venvs / "torch-2.15.0", pytest_code=4)
    argv = ["upgrade-gate", "2.15.0", "--venvs", str(venvs), "--out", str(out), "--index-url", "file:///idx/simple"]
    assert main(argv) == 2
    assert "-m pip install --quiet torch==2.15.0 --index-url file:///idx/simple" in calls.read_text()
    leg = json.loads((out / "torch-2.15.0" / "summary.json").read_text())
    assert leg["outcome"] == "broken" and leg["exit_code"] == 4
    assert leg["broken"] == ["pytest exited 4 before the gate wrote its report (see pytest.log)"]
    assert (out / "torch-2.15.0" / "summary.md").read_text().startswith("## fsdp-readings: broken (torch 2.15.0)")
    overall = json.loads((out / "summary.json").read_text())
    assert (overall["outcome"], overall["exit_code"]) == ("broken", 2)
    assert overall["legs"] == [
        {
            "release": "2.15.0",
            "torch": "2.15.0",
            "outcome": "broken",
            "exit_code": 4,
            "summary": "torch-2.15.0/summary.json",
            "comment": "torch-2.15.0/summary.md",
        }
    ]
    assert "| 2.15.0 | broken | 4 | pytest exited 4 before the gate wrote its report" in capsys.readouterr().out

    failing = tmp_path / "failing"
    stand_in_venv(failing / "torch-2.15.0", pip_fails=True)
    (failing / "torch-2.15.0" / "torch-installed").unlink(missing_ok=True)
    assert main(["upgrade-gate", "2.15.0", "--venvs", str(failing), "--out", str(out)]) == 2
    leg = json.loads((out / "torch-2.15.0" / "summary.json").read_text())  # the older leg's verdict is replaced
    assert leg["outcome"] == "broken" and leg["broken"][0].startswith("torch would not install: `")
    assert "-m pip install --quiet torch==2.15.0` exited 1" in leg["broken"][0]


def leg_summary(version: str, outcome: str, code: int, *, drifted: int, failed: list[dict]) -> dict:
    return {
        "torch": {"version": version},
        "outcome": outcome,
        "exit_code": code,
        "claims_ran": True,
        "anchors": {"total": 2, "drifted": drifted, "by_class": {"code changed": drifted} if drifted else {}},
        "claims": {"total": 2, "held": 2 - len(failed), "failed": len(failed), "skipped": 0},
        "reread": [{"guide": "16-fsdp2", "anchors": [{"name": "a"}]}] if drifted else [],
        "failed_claims": failed,
        "broken": [],
        "files": {"markdown": f"torch-{version}.md"},
    }


def test_the_summary_puts_the_legs_side_by_side(tmp_path: Path):
    failed = {"guide": "16-fsdp2", "claim": "x", "reason": "shard-rows", "at": "readings/16-fsdp2.md:40",
              "message": "rank 0: shard rows [3, 3, 3, 0]"}  # fmt: skip
    for version, data in {
        "2.14.1": leg_summary("2.14.1+cu130", "clean", 0, drifted=0, failed=[]),
        "2.15.0": leg_summary("2.15.0+cu132", "behaviour-changed", 1, drifted=1, failed=[failed]),
    }.items():
        (tmp_path / f"torch-{version}").mkdir()
        (tmp_path / f"torch-{version}" / "summary.json").write_text(json.dumps(data))
    text = summarize([tmp_path / "torch-2.14.1", tmp_path / "torch-2.15.0", tmp_path / "torch-2.16.0"])
    assert "| 2.14.1+cu130 | clean | 0 | 0 of 2 | — | 2 of 2 | 0 | 0 |" in text
    assert "| 2.15.0+cu132 | behaviour-changed | 1 | 1 of 2 | 1 code changed | 1 of 2 | 1 | 0 |" in text
    assert "| 2.16.0 | broken | 2 | no summary.json in " in text
    assert "- re-read `16-fsdp2`: a" in text
    assert "- claim `16-fsdp2/x` failed: `shard-rows` at readings/16-fsdp2.md:40 — rank 0: shard rows" in text


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
    folder = out / f"torch-{release}"
    data = json.loads((folder / f"torch-{release}.json").read_text())
    assert data["torch"]["version"] == torch.__version__ and data["exit_code"] == 0
    assert (folder / f"torch-{release}.md").read_text().startswith("## fsdp-readings: clean")
    assert json.loads((folder / "summary.json").read_text())["outcome"] == "clean"
    assert (folder / "pytest.log").is_file()
    assert f"| {torch.__version__} | clean | 0 | 0 of " in (out / "summary.md").read_text()
    assert json.loads((out / "summary.json").read_text())["outcome"] == "clean"


def test_releases_are_compared_as_versions(tmp_path: Path, capsys):
    """`2.15`, `2.15.0` and the `2.15.0+cu132` a CUDA build reports are one release: one leg, one venv, no
    reinstall, and no "the venv holds 2.15.0+cu132, not 2.15"."""
    legs = plan(["2.15", "2.15.0", "2.14.1+cu130"], tmp_path / "venvs", [], REPO)
    assert [(leg.release, leg.venv.name) for leg in legs] == [("2.15.0", "torch-2.15.0"), ("2.14.1", "torch-2.14.1")]
    (leg,) = plan(["2.15"], tmp_path / "venvs", [], REPO)
    setup = Setup(REPO, tmp_path / "out", [])
    assert commands(leg, setup, installed="2.15.0+cu132")[0][2] == "pytest"  # reused
    assert "torch==2.15.0" in commands(leg, setup, installed=None)[1]
    # A venv whose build step installed 2.15.0+cu132 for `2.15` is accepted, not refused as another release.
    (leg.venv / "bin").mkdir(parents=True)
    leg.python.write_text('#!/bin/sh\nif [ "$1" = -c ]; then echo 2.15.0+cu132; fi\nexit 0\n')
    leg.python.chmod(0o755)
    code = main(["upgrade-gate", "2.15", "--venvs", str(tmp_path / "venvs"), "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert "not 2.15" not in printed and "holds torch" not in printed
    assert code == 2 and "| 2.15.0 | broken | 0 | pytest exited 0 before the gate wrote its report" in printed
