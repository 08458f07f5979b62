"""``fsdp-readings upgrade-gate 2.14.1 2.15.0``: the guides run on other torch releases, for real.

For each release: a venv outside the repository with that torch installed (not previewed), this project
installed into it, and ``pytest readings/ --drift-report`` run in it. Each leg has a folder of its own,
``torch-<v>/``: ``torch-<v>.json`` and ``torch-<v>.md`` (the full report), ``summary.md`` (the PR comment),
``summary.json`` (its outcome) and ``pytest.log``. The reports folder's own ``summary.md`` and ``summary.json``
put the legs side by side. A leg whose torch would not install, or whose pytest stopped before the gate could
report, is ``broken`` and gets its summary all the same. A venv that already holds the release is reused, so a
second run costs only the tests.

Releases are compared as versions (``reader.gate.releases``): ``2.15``, ``2.15.0`` and the ``2.15.0+cu132`` a
CUDA build reports name one release, one leg, one venv ``torch-2.15.0``. The package index serves CUDA builds
of several GB; ``--index-url https://download.pytorch.org/whl/cpu`` installs the CPU build instead.

This is not part of ``.ci/run``: the project's own CI stays on 2.13.0. Exit status: the worst leg's outcome
(`reader.gate.outcome`; 0 clean, 6 re-read only, 1 behaviour changed, 2 broken), under ``--fail-on``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from reader.format.parse import find_readings
from reader.gate.outcome import (
    DEFAULT_FAIL_ON,
    FAIL_ON,
    FORMAT,
    SUMMARY_JSON,
    SUMMARY_MD,
    Outcome,
    broken_markdown,
    broken_summary,
    exit_code,
    worst,
    write_summary,
)
from reader.gate.releases import release, same_release

BROKEN = Outcome.BROKEN.code
LOG = "pytest.log"

EXAMPLES = """examples:
  fsdp-readings upgrade-gate 2.14.1 2.15.0 --venvs /tmp/gate
  fsdp-readings upgrade-gate 2.15.0 --venvs /tmp/g --index-url https://download.pytorch.org/whl/cpu
  fsdp-readings upgrade-gate 2.15.0 --venvs /tmp/g --wheel 2.15.0=/tmp/torch-2.15.0-cp311-linux.whl
  fsdp-readings upgrade-gate 2.15.0 --venvs /tmp/gate --pytest-arg=-k --pytest-arg=fsdp2 --dry-run

Each leg writes VENVS/reports/torch-<release>/: torch-<release>.json and .md (the full report),
summary.md (the PR comment), summary.json (its outcome) and pytest.log. VENVS/reports/summary.md
and summary.json hold every leg. --index-url: the package index serves CUDA builds of several GB;
the CPU index's are a few hundred MB.
exit status: the worst leg's: 0 clean, 6 re-read only, 1 behaviour changed, 2 broken (bad input,
or torch would not install)"""


@dataclass(frozen=True)
class Leg:
    release: str  # "2.15.0"
    venv: Path
    wheel: Path | None = None  # install this file instead of `torch==<release>` from the index

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def report(self) -> str:
        return f"torch-{self.release}"

    def folder(self, out: Path) -> Path:
        """Where this leg's reports go: its summary.json and summary.md would clash with another leg's."""
        return out / self.report


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXAMPLES
    parser.add_argument("releases", nargs="+", metavar="RELEASE", help="torch releases to install and run, e.g. 2.15.0")
    parser.add_argument(
        "--venvs", type=Path, required=True, help="directory for the venvs (outside the repository: several GB each)"
    )
    parser.add_argument("--out", type=Path, help="where the reports go (default: VENVS/reports)")
    parser.add_argument(
        "--wheel",
        action="append",
        default=[],
        metavar="RELEASE=PATH",
        help="install a downloaded wheel for this release instead of asking the package index",
    )
    parser.add_argument(
        "--index-url",
        metavar="URL",
        default=None,
        help="the index torch is installed from (pip's --index-url), e.g. https://download.pytorch.org/whl/cpu for "
        "CPU builds; the project's other requirements come from pip's usual index",
    )
    parser.add_argument(
        "--fail-on",
        choices=FAIL_ON,
        default=DEFAULT_FAIL_ON,
        help="the least severe outcome that fails: re-read (default), behaviour-changed, broken",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument(
        "--pytest-arg", action="append", default=[], metavar="ARG", help="an extra pytest argument (repeatable)"
    )


def run(args: argparse.Namespace, console: Console) -> int:
    readings = find_readings(args.readings)
    if readings is None:
        console.print("[red]no readings directory[/]: pass --readings DIR (a checkout's readings/)")
        return BROKEN
    project = readings.resolve().parent  # the checkout whose guides run (readings/ is not packaged)
    try:
        legs = plan(args.releases, args.venvs, args.wheel, project)
    except ValueError as exc:
        console.print(f"upgrade-gate: {exc}", markup=False, style="red")
        return BROKEN
    out: Path = (args.out or args.venvs / "reports").resolve()
    setup = Setup(project, out, args.pytest_arg, args.index_url, args.fail_on)
    outcomes: dict[str, Outcome] = {}
    for leg in legs:
        console.print(f"== torch {leg.release}: {leg.venv}", markup=False)
        outcomes[leg.release] = run_leg(leg, setup, console, dry_run=args.dry_run)
    if args.dry_run:
        return 0
    folders = [leg.folder(out) for leg in legs]
    side_by_side = summarize(folders)
    (out / SUMMARY_MD).write_text(side_by_side, encoding="utf-8")
    overall = worst(outcomes.values())
    write_summary(out, legs_summary(folders, overall, args.fail_on))
    console.print(side_by_side, markup=False)
    console.print(f"reports: {out}", markup=False)
    return exit_code(overall, args.fail_on)


@dataclass(frozen=True)
class Setup:
    """What every leg shares: the checkout, where reports go, and how torch is installed and the guides run."""

    project: Path
    out: Path
    extra: list[str]  # extra pytest arguments
    index_url: str | None = None
    fail_on: str = DEFAULT_FAIL_ON


def plan(releases: list[str], venvs: Path, wheels: list[str], project: Path) -> list[Leg]:
    """One leg per release; refuses venvs inside the project (they would be committed or copied around)."""
    root = venvs.resolve()
    if root == project or project in root.parents:
        raise ValueError(f"--venvs {venvs} is inside the project {project}; put the venvs elsewhere, e.g. /tmp")
    by_release: dict[str, Path] = {}
    for item in wheels:
        named, sep, path = item.partition("=")
        if not sep or not Path(path).is_file():
            raise ValueError(f"--wheel {item}: expected RELEASE=PATH to an existing wheel file")
        by_release[release(named)] = Path(path).resolve()
    legs: dict[str, Leg] = {}
    for named in releases:
        canonical = release(named)  # `2.15` and `2.15.0` are one leg
        legs.setdefault(canonical, Leg(canonical, root / f"torch-{canonical}", by_release.get(canonical)))
    return list(legs.values())


def commands(leg: Leg, setup: Setup, *, installed: str | None) -> list[list[str]]:
    """What a leg runs: build the venv and install unless it already holds the release, then the guides."""
    steps: list[list[str]] = []
    python = str(leg.python)
    if not same_release(installed, leg.release):
        if installed is None:
            steps.append([sys.executable, "-m", "venv", str(leg.venv)])
        torch = [str(leg.wheel)] if leg.wheel else [f"torch=={leg.release}"]
        if leg.wheel is None and setup.index_url:
            torch += ["--index-url", setup.index_url]  # torch only: the rest is not on a CPU index
        steps.append([python, "-m", "pip", "install", "--quiet", *torch])
        steps.append([python, "-m", "pip", "install", "--quiet", "-e", f"{setup.project}[dev]"])
    report = leg.folder(setup.out) / f"{leg.report}.json"
    gate = ["--drift-report", str(report), "--fail-on", setup.fail_on]
    steps.append([python, "-m", "pytest", "readings/", *gate, "-q", *setup.extra])
    return steps


def run_leg(leg: Leg, setup: Setup, console: Console, *, dry_run: bool) -> Outcome:
    """Build, install and run one leg; its outcome is what its summary.json says, written here when pytest could
    not write it (torch would not install, the venv holds another torch, pytest stopped before the gate)."""
    installed = installed_torch(leg)
    steps = commands(leg, setup, installed=installed)
    if dry_run:
        for step in steps:
            console.print("  " + " ".join(step), markup=False)
        return Outcome.CLEAN
    folder = leg.folder(setup.out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SUMMARY_JSON).unlink(missing_ok=True)  # an older run's verdict must not stand for this one
    *build, tests = steps
    for step in build:
        console.print("  " + " ".join(step), markup=False)
        done = subprocess.run(step, cwd=setup.project, check=False)
        if done.returncode != 0:
            console.print(f"  failed: {' '.join(step)}", markup=False, style="red")
            return _broken(folder, f"torch would not install: `{' '.join(step)}` exited {done.returncode}", leg)
    got = installed_torch(leg) if build else installed  # a reused venv was just asked
    if not same_release(got, leg.release):
        why = f"the venv holds torch {got}, not {leg.release} (a pip constraint?)"
        console.print(f"  {why}", markup=False, style="red")
        return _broken(folder, why, leg)
    console.print("  " + " ".join(tests), markup=False)
    with (folder / LOG).open("w", encoding="utf-8") as log:
        code = subprocess.run(tests, cwd=setup.project, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    written = folder / SUMMARY_JSON
    if not written.is_file():
        why = f"pytest exited {code} before the gate wrote its report (see {LOG})"
        return _broken(folder, why, leg, code=code)
    return Outcome(json.loads(written.read_text(encoding="utf-8"))["outcome"])


def _broken(folder: Path, why: str, leg: Leg, *, code: int = BROKEN) -> Outcome:
    data = broken_summary(why, code=code, torch_version=leg.release)
    write_summary(folder, data)
    (folder / SUMMARY_MD).write_text(broken_markdown(why, leg.release), encoding="utf-8")
    return Outcome.BROKEN


def installed_torch(leg: Leg) -> str | None:
    if not leg.python.exists():
        return None
    found = subprocess.run(
        [str(leg.python), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, check=False
    )
    return found.stdout.strip() if found.returncode == 0 else ""


def _leg_summary(folder: Path) -> dict[str, Any]:
    path = folder / SUMMARY_JSON
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    return broken_summary(f"no {SUMMARY_JSON} in {folder}", torch_version=folder.name.removeprefix("torch-"))


def legs_summary(folders: list[Path], overall: Outcome, fail_on: str) -> dict[str, Any]:
    """The reports folder's summary.json: the worst outcome, its exit code, and each leg's."""
    legs = []
    for folder in folders:
        data = _leg_summary(folder)
        legs.append(
            {
                "release": folder.name.removeprefix("torch-"),
                "torch": data["torch"]["version"],
                "outcome": data["outcome"],
                "exit_code": data["exit_code"],
                "summary": f"{folder.name}/{SUMMARY_JSON}",
                "comment": f"{folder.name}/{SUMMARY_MD}",
            }
        )
    return {"format": FORMAT, "outcome": overall.value, "exit_code": exit_code(overall, fail_on), "fail_on": fail_on,
            "legs": legs}  # fmt: skip


def summarize(folders: list[Path]) -> str:
    """The legs side by side: outcome, drift by class, claims, and every drifted anchor and failed claim by name."""
    rows = [
        "| torch | outcome | exit | anchors drifted | by class | claims held | failed | skipped |",
        "|---|---|---|---|---|---|---|---|",
    ]
    details: list[str] = []
    for folder in folders:
        data = _leg_summary(folder)
        version = data["torch"]["version"] or folder.name
        anchors, claims = data["anchors"], data["claims"]
        by_class = ", ".join(f"{n} {k}" for k, n in sorted(anchors["by_class"].items(), key=lambda kv: -kv[1]))
        if data["outcome"] == Outcome.BROKEN and not anchors["total"]:
            why = data["broken"][0] if data["broken"] else "no report"
            rows.append(f"| {version} | broken | {data['exit_code']} | {why} | | | | |")
            continue
        held = f"{claims['held']} of {claims['total']}" if data["claims_ran"] else "did not run"
        rows.append(
            f"| {version} | {data['outcome']} | {data['exit_code']} | {anchors['drifted']} of {anchors['total']} "
            f"| {by_class or '—'} | {held} | {claims['failed']} | {claims['skipped']} |"
        )
        details += ["", f"### torch {version}", ""]
        reread = [f"- re-read `{g['guide']}`: {', '.join(a['name'] for a in g['anchors'])}" for g in data["reread"]]
        details += reread or ["- no anchor drifted"]
        details += [
            f"- claim `{c['guide']}/{c['claim']}` failed: `{c['reason']}` at {c['at']} — {c['message']}"
            for c in data["failed_claims"]
        ]
        details.append(f"- reports: {folder.name}/{SUMMARY_MD}, {folder.name}/{data['files'].get('markdown', '?')}")
    return "\n".join(["## fsdp-readings upgrade gate", "", *rows, *details]) + "\n"
