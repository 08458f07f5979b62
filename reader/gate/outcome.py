"""The gate's verdict for bots: one outcome per leg, its exit code, and the ``summary.json`` a workflow reads.

Outcomes, least to most severe:

- ``clean`` (exit 0): every anchor reads as approved and every claim that ran held.
- ``re-read`` (exit 6): anchors drift and every claim that ran held; a person re-reads the guides, then approves.
- ``behaviour-changed`` (exit 1): a claim (or another test of the session) failed.
- ``broken`` (exit 2): bad input (a guide, the lock, an option), torch would not install, or the gate could not
  run at all (pytest's own usage error, 4, or "no tests", 5, map here).

``--fail-on`` names the least severe outcome that fails: below it a leg exits 0, and ``summary.json`` still says
what it found. ``broken`` always fails. ``python -m reader.gate.outcome broken DIR --why ...`` writes the
``summary.json`` of a leg the gate never reached (pytest refused its command line, torch did not install).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

from reader.claims.status import Status
from reader.gate.report import GuideReport, SessionReport, reread_lines

SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
FORMAT = 1  # summary.json's format: bumped when a key changes meaning


class Outcome(StrEnum):
    CLEAN = "clean"
    REREAD = "re-read"
    BEHAVIOUR = "behaviour-changed"
    BROKEN = "broken"

    @property
    def code(self) -> int:
        return _CODES[self]

    @property
    def severity(self) -> int:
        return list(Outcome).index(self)

    @property
    def meaning(self) -> str:
        return _MEANINGS[self]


# 1 stays "a claim failed" (pytest's "tests failed", `fsdp-readings check`'s 1); 2 stays broken input. Drift
# alone gets a code of its own, so that a bot can tell "re-read the guides" from "torch behaves differently": 6,
# the first that pytest never exits with (its 3 is a crash, and a crash must not read as "re-read only").
_CODES = {Outcome.CLEAN: 0, Outcome.BEHAVIOUR: 1, Outcome.BROKEN: 2, Outcome.REREAD: 6}
_MEANINGS = {
    Outcome.CLEAN: "every anchor reads as approved and every claim that ran held",
    Outcome.REREAD: "anchors drift, every claim that ran held: re-read the guides, then approve them",
    Outcome.BEHAVIOUR: "a claim failed: torch behaves differently, or a check is too close to the old code",
    Outcome.BROKEN: "the gate could not judge: bad input, or torch would not install",
}
FAIL_ON = (Outcome.REREAD.value, Outcome.BEHAVIOUR.value, Outcome.BROKEN.value)
DEFAULT_FAIL_ON = Outcome.REREAD.value

# pytest's own exit statuses that mean the gate reached no verdict.
PYTEST_INTERRUPTED, PYTEST_INTERNAL_ERROR, PYTEST_USAGE_ERROR, PYTEST_NO_TESTS = 2, 3, 4, 5


def exit_code(outcome: Outcome, fail_on: str = DEFAULT_FAIL_ON) -> int:
    """The outcome's code, or 0 when it is less severe than ``fail_on`` (``broken`` always fails)."""
    if outcome is not Outcome.BROKEN and outcome.severity < Outcome(fail_on).severity:
        return 0
    return outcome.code


def worst(outcomes: Iterable[Outcome]) -> Outcome:
    return max(outcomes, key=lambda o: o.severity, default=Outcome.CLEAN)


def outcome_of(report: SessionReport) -> Outcome:
    """What the session's findings amount to (the caller adds what only it knows: pytest's own status)."""
    if report.broken:
        return Outcome.BROKEN
    failed = [c for g in report.guides for c in g.claims if c.outcome is Status.FAILED]
    if report.other_failures or any(c.ran for c in failed):
        return Outcome.BEHAVIOUR
    if any(not c.blocked for c in failed):  # it never ran, and no anchor blocked it: the rank pool could not
        return Outcome.BROKEN
    if report.drifted or failed or report.refused:  # a blocked claim waits on its anchors' re-reading
        return Outcome.REREAD
    return Outcome.CLEAN


# --- summary.json ----------------------------------------------------------------------------------------------


def summary_data(report: SessionReport, files: dict[str, str] | None = None) -> dict[str, Any]:
    """summary.json: the outcome and exit code first, then the counts and lists a bot (or a reviewer) acts on."""
    outcome = Outcome(report.outcome or Outcome.BROKEN)
    anchors = [a for g in report.guides for a in g.anchors]
    claims = [c for g in report.guides for c in g.claims]
    by_class: dict[str, int] = {}
    for row in report.drifted:
        by_class[row.kind or "?"] = by_class.get(row.kind or "?", 0) + 1
    return {
        "format": FORMAT,
        "outcome": outcome.value,
        "meaning": outcome.meaning,
        "exit_code": report.exit_code if report.exit_code is not None else exit_code(outcome, report.fail_on),
        "fail_on": report.fail_on,
        "torch": {"version": report.torch_version, "git_version": report.torch_git, "source": report.source},
        "claims_ran": report.claims_not_run is None,
        "why_claims_did_not_run": report.claims_not_run,
        "anchors": {"total": len(anchors), "drifted": len(report.drifted), "by_class": by_class},
        "claims": {
            "total": len(claims),
            "held": sum(g.claims_held for g in report.guides),
            "failed": sum(1 for c in claims if c.outcome is Status.FAILED),
            "skipped": sum(1 for c in claims if c.outcome is Status.SKIPPED),
        },
        "reread": [_reread(g) for g in report.guides if any(a.outcome is Status.FAILED for a in g.anchors)],
        "failed_claims": [
            {
                "guide": g.id,
                "claim": c.id,
                "reason": c.reason or "error",
                "at": f"{g.path}:{c.at}",
                "claim_line": c.line,
                "expect": c.expect.to_json() if c.expect is not None else None,
                "message": c.message,
            }
            for g in report.guides
            for c in g.claims
            if c.outcome is Status.FAILED
        ],
        "other_failures": report.other_failures,
        "refused": report.refused,
        "broken": [problem.splitlines()[0] for problem in report.broken],
        "files": files or {},
    }


def _reread(guide: GuideReport) -> dict[str, Any]:
    rows = [a for a in guide.anchors if a.outcome is Status.FAILED]
    return {
        "guide": guide.id,
        "path": guide.path,
        "lines": reread_lines(rows),
        "anchors": [{"name": a.name, "class": a.kind, "also": a.also, "notes_lost": len(a.lost_notes)} for a in rows],
        "approve": f"fsdp-readings approve {guide.id}",
    }


def write_summary(directory: Path, data: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / SUMMARY_JSON
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def broken_summary(why: str, *, code: int = Outcome.BROKEN.code, torch_version: str | None = None) -> dict[str, Any]:
    """summary.json of a leg the gate never judged: pytest refused its command line, or torch did not install."""
    report = SessionReport(torch_version, None, "", "", broken=[why])
    report.outcome, report.exit_code, report.claims_not_run = Outcome.BROKEN.value, code, why
    return summary_data(report)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reader.gate.outcome",
        description="write summary.json (and summary.md) for a leg the gate never reached",
        epilog="example: python -m reader.gate.outcome broken gate-reports --why 'pytest exited 4' --exit-code 4",
    )
    parser.add_argument("outcome", choices=[Outcome.BROKEN.value])
    parser.add_argument("directory", type=Path, help="where the leg's reports go")
    parser.add_argument("--why", required=True, help="what went wrong, in one line")
    parser.add_argument("--exit-code", type=int, default=Outcome.BROKEN.code, help="the exit status it had")
    parser.add_argument("--torch", default=None, metavar="VERSION", help="the leg's torch, if known")
    args = parser.parse_args(argv)
    data = broken_summary(args.why, code=args.exit_code, torch_version=args.torch)
    write_summary(args.directory, data)
    (args.directory / SUMMARY_MD).write_text(broken_markdown(args.why, args.torch), encoding="utf-8")
    return 0


def broken_markdown(why: str, torch_version: str | None) -> str:
    return f"## fsdp-readings: broken (torch {torch_version or '?'})\n\nThe gate could not judge this leg: {why}\n"


if __name__ == "__main__":
    sys.exit(main())
