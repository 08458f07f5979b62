"""pytest plugin: ``readings/**/*.md`` guides become items.

- ``readings/04-forward-prefetch.md::anchor[prefetch]`` passes while the anchor's live torch source is the
  approved one (unchanged, moved, or only cosmetically changed: reported as a note) and fails otherwise, with
  the drift class, a diff approved → current, both locations and the approve command.
- ``readings/04-forward-prefetch.md::claim[forward-order]`` runs its check on the rank pool and passes only if
  the check passed and some anchored torch code ran on a rank (runtime evidence).

Item ids come from anchor names and claim ids, never from line numbers. Failures point at the guide's own
lines (like pytest's doctest items). A broken guide is a collection error naming file, line and fix; the other
guides still run.

The session's exit code is its outcome's (`reader.gate.outcome`): 0 clean, 6 re-read only (drift, every claim
held), 1 behaviour changed (a claim or another test failed), 2 broken (bad input, including this plugin's own
option errors, an interrupted run, and "no tests" under ``--drift-report``); ``--fail-on`` lets the milder ones
exit 0. Sessions that collect no guide and ask for no report keep pytest's own code.

Options: ``--approve[=GUIDE_ID]`` (with ``--force REASON``), ``--torch-source PATH``, ``--drift-report FILE``,
``--fail-on OUTCOME``; ini ``readings_dir``. Approving runs the guide's claims in the same session and records
the guide only if they held (``reader.pytest_plugin.approving``).

This module holds only the hooks; the nodes are in ``reader.pytest_plugin.items``, their failure text in
``reader.pytest_plugin.failures``, the session's state in ``reader.pytest_plugin.session``.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from checks.ranks.protocol import CheckRequest, CheckRun, Patch
from reader.claims.pictures import Pictures
from reader.claims.progress import Progress, ProgressError
from reader.claims.records import record_verdicts
from reader.claims.request import traced_request
from reader.claims.status import Status
from reader.claims.verdict import ClaimVerdict
from reader.format.guide import ClaimSpec, Guide
from reader.gate.drift_report import write_drift_report
from reader.gate.outcome import (
    DEFAULT_FAIL_ON,
    FAIL_ON,
    PYTEST_INTERNAL_ERROR,
    PYTEST_INTERRUPTED,
    PYTEST_NO_TESTS,
    PYTEST_USAGE_ERROR,
    Outcome,
    exit_code,
    outcome_of,
)
from reader.gate.report import ClaimRow, SessionReport, anchor_row, expect_pointer, summary
from reader.pytest_plugin import approving as approvals
from reader.pytest_plugin import hookspecs
from reader.pytest_plugin.items import AnchorItem, ClaimItem, GuideFile, GuideItem, is_guide_file
from reader.pytest_plugin.session import SESSION, ReaderSession, session_of

BROKEN_INPUT = Outcome.BROKEN.code
MARKERS = (
    "gpu: needs CUDA devices and the nccl backend",
    "world_size(n): the number of ranks a check runs on",
    "slow: takes more than a few seconds; skipped unless --slow (or FSDP_READINGS_SLOW=1, or -m naming slow)",
)
SLOW_ENV = "FSDP_READINGS_SLOW"


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fsdp-readings", "reading guides over torch source (reader/)")
    group.addoption(
        "--approve",
        action="append",
        nargs="?",
        const="*",
        default=None,
        metavar="GUIDE_ID",
        help="after re-reading GUIDE_ID (repeatable, comma-separated), run its claims and record its anchors' "
        "torch source in readings/anchors.lock, all or nothing, if every claim held. Bare: the one guide whose "
        "anchors drift. Put paths before it.",
    )
    group.addoption(
        "--force",
        metavar="REASON",
        default=None,
        help="with --approve: approve although a claim failed or did not run, for this reason (kept in the lock)",
    )
    group.addoption(
        "--torch-source",
        metavar="PATH",
        default=None,
        help="read anchors from a torch wheel (read in place), site-packages dir or checkout instead of the "
        "installed torch; runs anchor items only (claims are skipped)",
    )
    group.addoption(
        "--drift-report",
        metavar="FILE",
        default=None,
        help="write the session's drift report as JSON to FILE and as Markdown next to it (FILE.md), and beside "
        "them summary.md (the PR comment) and summary.json (the outcome), even when the session is broken",
    )
    group.addoption(
        "--fail-on",
        choices=FAIL_ON,
        default=DEFAULT_FAIL_ON,
        help="the least severe outcome that fails the session: re-read (default: drift alone exits 6), "
        "behaviour-changed (drift alone exits 0, a failed claim 1), broken (only broken input fails, exit 2)",
    )
    group.addoption(
        "--slow",
        action="store_true",
        default=os.environ.get(SLOW_ENV, "") not in ("", "0"),
        help=f"also run items marked slow (long property runs); env {SLOW_ENV}=1",
    )
    parser.addini("readings_dir", "directory holding the reading guides and anchors.lock", default="readings")


def runs_slow(config: pytest.Config) -> bool:
    """Slow items run with --slow, or when a -m expression names the marker (the user asked for them)."""
    return bool(config.getoption("--slow")) or "slow" in (config.getoption("markexpr", "") or "")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # after deselection: what runs is what is judged
    approving = approvals.plan(session_of(config), items, GuideItem, AnchorItem)
    if runs_slow(config):
        return
    skip = pytest.mark.skip(reason=f"slow: run with --slow (or {SLOW_ENV}=1)")
    for item in items:
        approved_here = isinstance(item, GuideItem) and item.guide.id in approving  # approval runs every claim
        if item.get_closest_marker("slow") is not None and not approved_here:
            item.add_marker(skip)


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        if not any(existing.split(":")[0] == line.split(":")[0] for existing in config.getini("markers")):
            config.addinivalue_line("markers", line)
    try:
        config.stash[SESSION] = ReaderSession(config)
    except pytest.UsageError as exc:
        config.stash[REFUSED] = str(exc)  # refused once every plugin is configured (`pytest_sessionstart`)


REFUSED = pytest.StashKey[str]()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """A command line the gate cannot act on is broken input, exit 2 like every front end's, and the report (if
    asked for) still says so: a workflow that posts it never posts a missing file."""
    problem = session.config.stash.get(REFUSED, None)
    if problem is None:
        return
    report = SessionReport(None, None, "", "", broken=[problem], claims_not_run="the command line was refused")
    report.outcome, report.exit_code = Outcome.BROKEN.value, BROKEN_INPUT
    target = session.config.getoption("drift_report")
    if target and not problem.startswith("--drift-report"):  # a reserved report name is refused, not written
        write_drift_report(Path(target), report)
    pytest.exit(problem, returncode=BROKEN_INPUT)


def pytest_unconfigure(config: pytest.Config) -> None:
    reader = config.stash.get(SESSION, None)
    if reader is not None:
        reader.resources.close()


def claim_request(
    config: pytest.Config, guide: Guide, claim: ClaimSpec, *, patches: tuple[Patch, ...] = (), **overrides: Any
) -> CheckRequest:
    """The `CheckRequest` the claim's item sends (the same trace symbols), with break-it ``patches`` and kwarg
    ``overrides``: break-it tests run claims through this, so they and the items share one request path.
    Raises `RuntimeError` (``reader.claims.request.UnresolvedAnchors``) when the guide's anchors do not resolve."""
    workspace = session_of(config).resources.workspace()
    # Read on this torch, as the item is: an expect block written per release has one version here.
    request, _ = traced_request(workspace, guide.on(workspace.torch_version), claim, patches=patches, **overrides)
    return request


# --- collection ---------------------------------------------------------------------------------------------


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> GuideFile | None:
    if is_guide_file(file_path, parent.session):
        return GuideFile.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> Iterator[None]:
    """Let the other guides run when every collection error is a broken guide (broken tests still abort)."""
    broken = session_of(session.config).findings.broken
    option = session.config.option
    original = option.continue_on_collection_errors
    if session.testsfailed and session.testsfailed == len(broken):
        option.continue_on_collection_errors = True
    try:
        return (yield)
    finally:
        option.continue_on_collection_errors = original


# --- reporting ----------------------------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report: pytest.TestReport = yield
    reader = item.config.stash.get(SESSION, None)
    if reader is None:
        return report
    if isinstance(item, AnchorItem | ClaimItem):
        if report.when == "call" or (report.when == "setup" and not report.passed):
            _record(reader, item, report)
    elif report.failed:  # a predict answer that changed (or whose claim failed), or a test beside the guides
        first = report.longreprtext.strip().split("\n")[0]
        reader.findings.report.other_failures.append(f"{item.nodeid} ({report.when}): {first}"[:300])
    return report


def _record(reader: ReaderSession, item: GuideItem, report: pytest.TestReport) -> None:
    guide = item.guide
    row = reader.findings.report.guide(guide.id, reader.display(guide.path), guide.title)
    if isinstance(item, AnchorItem):
        row.anchors.append(anchor_row(guide, item.anchor, _anchor_status(item, report), item.drift, _said(report)))
    elif isinstance(item, ClaimItem):
        verdict = item.verdict if item.verdict is not None else ended_by_pytest(report)
        item.verdict = verdict
        reader.findings.verdicts.setdefault((guide.id, item.claim.id), verdict)
        claim = ClaimRow.of(item.claim, verdict)
        if verdict.status is Status.FAILED and verdict.decided:
            _locate(reader, guide, item, claim, verdict.outcome)
        row.claims.append(claim)


def _anchor_status(item: AnchorItem, report: pytest.TestReport) -> Status:
    """An anchor item's status is pytest's outcome of it (its drift is on the item), or approved."""
    if report.passed:
        return Status.APPROVED if item.approved else Status.PASSED
    return Status.SKIPPED if report.skipped else Status.FAILED


def _said(report: pytest.TestReport) -> str:
    """What pytest shows of an item that did not pass, in a line: why it was skipped, or its failure's first."""
    if report.skipped:
        return str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else ""
    return report.longreprtext.strip().split("\n")[0] if report.failed else ""


def ended_by_pytest(report: pytest.TestReport) -> ClaimVerdict:
    """The verdict of a claim item that pytest ended before `decide` reached one: skipped at setup (slow) or for
    a guide of another torch, a ``--torch-source`` preview, or an error in the reader (torch's source unreadable).
    It holds what pytest said and is not decided: no result of the claim's, so the progress file never keeps it."""
    if report.skipped:
        return ClaimVerdict.skip(_said(report).removeprefix("Skipped: "), decided=False)
    return ClaimVerdict.fail(None, report.longreprtext, reason=None, summary=_said(report), decided=False)


def _locate(reader: ReaderSession, guide: Guide, item: ClaimItem, claim: ClaimRow, run: CheckRun | None) -> None:
    """Where the guide is now wrong: the expect rows its check names, or, for a claim that could not run, whether
    anchors that no longer resolve blocked it (drift to re-read, not a behaviour change)."""
    workspace = reader.resources.opened
    if workspace is None:
        return
    if run is None:
        claim.ran = False
        claim.blocked = bool(workspace.resolutions(guide)[1])
        return
    claim.expect = expect_pointer(
        guide.on(workspace.torch_version), item.claim, run.expect_rows, run.reason is not None
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reader = session.config.stash.get(SESSION, None)
    if reader is None:
        return
    options, findings, workspace = reader.options, reader.findings, reader.resources.opened
    if options.approve_ids is not None:
        collected = set(findings.guides.guides)
        for unknown in sorted(options.approve_ids - collected - {approvals.BARE}):
            known = ", ".join(sorted(collected)) or "none"
            findings.broken[f"--approve={unknown}"] = (
                f"--approve={unknown}: no collected guide has this id (collected: {known})"
            )
        if workspace is not None:
            workspace.save()  # only what `Workspace.approve_guide` recorded, whole guides
    reader.describe_torch()
    report = findings.report
    report.broken = list(findings.broken.values())
    if findings.lock_error is not None:
        report.broken.append(str(findings.lock_error))
    if options.torch_source:
        report.claims_not_run = (
            f"--torch-source previews the source only; install torch {report.torch_version or 'of that source'} "
            "and run `pytest readings/` there to run them"
        )
    judged = bool(report.guides or report.broken or options.drift_report or options.approve_ids is not None)
    if judged:  # a session of guides (or one asked for a report): its exit code is its outcome's
        outcome = _judge(report, int(session.exitstatus), reporting=options.drift_report is not None)
        report.outcome = outcome.value
        # pytest's own usage error is raised past this hook: its 4 is the exit code, whatever is set here
        code = PYTEST_USAGE_ERROR if session.exitstatus == PYTEST_USAGE_ERROR else exit_code(outcome, options.fail_on)
        session.exitstatus, report.exit_code = code, code
    else:
        report.exit_code = int(session.exitstatus)
    if options.drift_report is not None:
        findings.written = write_drift_report(options.drift_report, report)
    _remember(reader)


_PYTEST_BROKE = {  # pytest's own statuses that leave the gate without a verdict
    PYTEST_INTERRUPTED: "pytest was interrupted (Ctrl-C, or errors while collecting tests; its exit 2)",
    PYTEST_INTERNAL_ERROR: "pytest stopped on an internal error (its exit 3)",
    PYTEST_USAGE_ERROR: "pytest refused its command line (a usage error): exit 4",
}


def _judge(report: SessionReport, status: int, *, reporting: bool) -> Outcome:
    """The session's outcome: its findings, and what only pytest knows (it stopped, or ran nothing)."""
    found = outcome_of(report)
    if status in _PYTEST_BROKE:
        report.broken.append(_PYTEST_BROKE[status])
        return Outcome.BROKEN
    if status == PYTEST_NO_TESTS and reporting:  # a gate run that judged nothing has no verdict to give
        report.broken.append("no test ran (pytest's exit 5): the selection left no guide item")
        return Outcome.BROKEN
    if status == pytest.ExitCode.TESTS_FAILED and found is Outcome.CLEAN:
        report.broken.append("pytest reported a failure that no guide item or test report shows")
        return Outcome.BROKEN
    return found


def _remember(reader: ReaderSession) -> None:
    """Record each decided claim's result in the learner's progress file (``fsdp-readings list`` shows it), with
    the torch it ran on, and the pictures of passing ones (`reader.claims.records`). Under torchrun every rank
    reached the same verdicts; rank 0 writes them."""
    findings, workspace = reader.findings, reader.resources.opened
    guides = findings.guides.guides
    decided = [(gid, guides[gid].claim(cid), v) for (gid, cid), v in findings.verdicts.items() if v.decided]
    if not decided or workspace is None or os.environ.get("RANK", "0") != "0":
        return
    try:
        progress, drawn = Progress(), Pictures()
        kept = record_verdicts(decided, workspace.torch_version, progress, drawn)
        progress.save()
        if kept:  # for the site's pages (`fsdp-readings site`)
            drawn.save()
    except (ProgressError, OSError) as exc:
        findings.progress_problem = f"claim results not recorded: {exc}"


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    reader = config.stash.get(SESSION, None)
    if reader is None or not (reader.findings.report.guides or reader.findings.broken):
        return
    findings = reader.findings
    writer = config.get_terminal_writer()
    console = Console(
        file=io.StringIO(),
        force_terminal=writer.hasmarkup,
        no_color=not writer.hasmarkup,
        width=max(writer.fullwidth, 60),
        highlight=False,
        soft_wrap=True,  # paths in the heading are printed whole, never cropped
    )
    console.print(summary(findings.report))
    terminalreporter.write_sep("=", "reading guides")
    terminalreporter.write(console.file.getvalue())
    for key in [k for k in findings.broken if k.startswith("--approve")]:
        terminalreporter.write_line(findings.broken[key], red=True)
    if findings.written:
        json_path, md_path = findings.written
        terminalreporter.write_line(f"drift report: {reader.display(json_path)}, {reader.display(md_path)}")
        beside = json_path.parent
        terminalreporter.write_line(
            f"summary: {reader.display(beside / 'summary.md')}, {reader.display(beside / 'summary.json')}"
        )
    if findings.progress_problem:
        terminalreporter.write_line(findings.progress_problem, yellow=True)
