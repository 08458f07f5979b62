"""``fsdp-readings upgrade-gate 2.14.1 2.15.0``: the guides run on other torch releases, for real.

For each release: a venv outside the repository with that torch installed (not previewed), this project
installed into it, and ``pytest readings/ --drift-report`` run in it. Each leg leaves ``torch-<v>.json`` and
``torch-<v>.md`` (the report a reviewer reads) and ``torch-<v>.log`` (pytest's output); ``summary.md`` puts the
legs side by side. A venv that already holds the release is reused, so a second run costs only the tests.

Releases are compared as versions (``reader.gate.releases``): ``2.15``, ``2.15.0`` and the ``2.15.0+cu132`` a
CUDA build reports name one release, one leg, one venv ``torch-2.15.0``.

This is not part of ``.ci/run``: the builds are CUDA wheels of several GB, and the project's own CI stays on
2.13.0. Exit status: the worst leg's (0 clean, 1 drift or a failed claim, 2 broken input or a failed build).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from reader.format.parse import find_readings
from reader.gate.releases import release, same_release

BROKEN = 2


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


def configure(parser: argparse.ArgumentParser) -> None:
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
    extra: list[str] = args.pytest_arg
    codes: dict[str, int] = {}
    for leg in legs:
        console.print(f"== torch {leg.release}: {leg.venv}", markup=False)
        codes[leg.release] = run_leg(leg, project, out, extra, console, dry_run=args.dry_run)
    if args.dry_run:
        return 0
    summary = summarize([out / f"{leg.report}.json" for leg in legs], codes)
    (out / "summary.md").write_text(summary, encoding="utf-8")
    console.print(summary, markup=False)
    console.print(f"reports: {out}", markup=False)
    return max(codes.values(), default=0)


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


def commands(leg: Leg, project: Path, out: Path, extra: list[str], *, installed: str | None) -> list[list[str]]:
    """What a leg runs: build the venv and install unless it already holds the release, then the guides."""
    steps: list[list[str]] = []
    python = str(leg.python)
    if not same_release(installed, leg.release):
        if installed is None:
            steps.append([sys.executable, "-m", "venv", str(leg.venv)])
        steps.append([python, "-m", "pip", "install", "--quiet", str(leg.wheel or f"torch=={leg.release}")])
        steps.append([python, "-m", "pip", "install", "--quiet", "-e", f"{project}[dev]"])
    report = out / f"{leg.report}.json"
    steps.append([python, "-m", "pytest", "readings/", "--drift-report", str(report), "-q", *extra])
    return steps


def run_leg(leg: Leg, project: Path, out: Path, extra: list[str], console: Console, *, dry_run: bool) -> int:
    installed = installed_torch(leg)
    steps = commands(leg, project, out, extra, installed=installed)
    if dry_run:
        for step in steps:
            console.print("  " + " ".join(step), markup=False)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    *build, tests = steps
    for step in build:
        console.print("  " + " ".join(step), markup=False)
        if subprocess.run(step, cwd=project, check=False).returncode != 0:
            console.print(f"  failed: {' '.join(step)}", markup=False, style="red")
            return BROKEN
    got = installed_torch(leg) if build else installed  # a reused venv was just asked
    if not same_release(got, leg.release):
        console.print(f"  the venv holds torch {got}, not {leg.release} (a pip constraint?)", markup=False, style="red")
        return BROKEN
    console.print("  " + " ".join(tests), markup=False)
    with (out / f"{leg.report}.log").open("w", encoding="utf-8") as log:
        return subprocess.run(tests, cwd=project, stdout=log, stderr=subprocess.STDOUT, check=False).returncode


def installed_torch(leg: Leg) -> str | None:
    if not leg.python.exists():
        return None
    found = subprocess.run(
        [str(leg.python), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, check=False
    )
    return found.stdout.strip() if found.returncode == 0 else ""


def summarize(reports: list[Path], codes: dict[str, int] | None = None) -> str:
    """The legs side by side: drift by class, claims, and every drifted anchor and failed claim by name."""
    rows = [
        "| torch | exit | anchors drifted | by class | claims held | failed | skipped |",
        "|---|---|---|---|---|---|---|",
    ]
    details: list[str] = []
    for path in reports:
        if not path.is_file():
            rows.append(
                f"| {path.stem} | {(codes or {}).get(path.stem.removeprefix('torch-'), BROKEN)} | no report | | | | |"
            )
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        version = data["torch"]["version"]
        guides = data["guides"]
        drifted = [(g["id"], a) for g in guides for a in g["anchors"] if a["outcome"] == "failed"]
        claims = [(g["id"], c) for g in guides for c in g["claims"]]
        held = sum(1 for _, c in claims if c["outcome"] in ("passed", "xfailed", "xpassed"))
        failed = [(gid, c) for gid, c in claims if c["outcome"] == "failed"]
        skipped = sum(1 for _, c in claims if c["outcome"] == "skipped")
        kinds = Counter(a["drift"] for _, a in drifted)
        by_class = ", ".join(f"{n} {k}" for k, n in kinds.most_common())
        rows.append(
            f"| {version} | {data['exit_code']} | {len(drifted)} of {sum(len(g['anchors']) for g in guides)} "
            f"| {by_class or '—'} | {held} of {len(claims)} | {len(failed)} | {skipped} |"
        )
        details += ["", f"### torch {version}", ""]
        details += [f"- anchor `{gid}/{a['name']}`: {a['drift']}" for gid, a in drifted] or ["- no anchor drifted"]
        details += [f"- claim `{gid}/{c['id']}` failed: `{c['reason']}` — {c['message']}" for gid, c in failed]
        details.append(f"- report: {path.with_suffix('.md').name}")
    return "\n".join(["## fsdp-readings upgrade gate", "", *rows, *details]) + "\n"
