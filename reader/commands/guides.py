"""The commands over guides and their anchors: ``list`` (where each guide stands), ``show`` (a guide with its torch
source quoted live), ``drift`` (anchors against the approved source) and ``approve`` (record the source read)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from checks.breakit.exercises import exercise_modules
from reader.claims.progress import Progress, ProgressError, Section
from reader.claims.status import Status, tally
from reader.format.errors import CommandProblem
from reader.format.guide import Guide
from reader.format.predict import PredictQuestion
from reader.gate.approval import NotApprovable, force_reason
from reader.gate.drift import Drift, DriftKind
from reader.gate.drift_report import reserved_name, write_drift_report
from reader.gate.lock import LockError
from reader.gate.outcome import DEFAULT_FAIL_ON, FAIL_ON, Outcome, exit_code, worst
from reader.gate.releases import release, sorted_releases
from reader.gate.report import AnchorRow, SessionReport, anchor_row, summary
from reader.gate.workspace import Workspace
from reader.source.checkref import CheckFinder
from reader.study.runner import ClaimRunner, claim_runner, pool_options
from reader.study.session import BROKEN, CLEAN, add_common, display, open_session
from reader.views.drift import drift_panel
from reader.views.fit import indented, items_line
from reader.views.guide import print_guide
from reader.views.path import print_next
from reader.views.problem import guarded

DRIFT_EXAMPLES = """examples:
  fsdp-readings drift                          every guide's anchors against readings/anchors.lock
  fsdp-readings drift 03-unshard-reshard       one guide
  fsdp-readings drift --torch-source torch-2.15.0-cp311-cp311-manylinux_2_28_x86_64.whl
  fsdp-readings drift --torch-source /tmp/v/lib/python3.11/site-packages --report gate/t.json
  fsdp-readings drift --fail-on broken         show the drift; exit 0 unless the input is broken

--torch-source previews another torch (a wheel read in place, a site-packages, a checkout).
--report also writes FILE.md, summary.md (a PR comment) and summary.json (the outcome) beside it.
Claims do not run here: pytest readings/ runs them.
exit status: 0 clean, 6 anchors drift (re-read the guides), 2 broken input"""


def configure_drift(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = "compare the guides' anchors with the approved source (exit 0 clean, 6 drift, 2 broken)"
    parser.epilog = DRIFT_EXAMPLES
    add_common(parser)
    parser.add_argument(
        "--report",
        metavar="FILE",
        type=Path,
        default=None,
        help="also write the report as JSON to FILE and as Markdown next to it, with summary.md and summary.json",
    )
    parser.add_argument(
        "--fail-on",
        choices=FAIL_ON,
        default=DEFAULT_FAIL_ON,
        help="the least severe outcome that fails: re-read (default); behaviour-changed or broken let drift "
        "exit 0 (drift runs no claims)",
    )


@guarded
def run_drift(args: argparse.Namespace, console: Console) -> int:
    if args.report is not None and (clash := reserved_name(args.report)):
        raise CommandProblem(clash, "name the report another way: --report FILE")
    try:
        opened = open_session(args, console)
    except CommandProblem:
        if args.report is not None:  # the report says so: a workflow that posts it never posts a missing file
            write_drift_report(args.report, _refused(args))
        raise
    workspace, report = opened.workspace, opened.report
    for guide in opened.guides:
        row = report.guide(guide.id, display(guide.path), guide.title)
        applies = guide.applies_to(workspace.torch_version)
        for anchor in guide.anchors:
            if not applies:
                row.anchors.append(
                    AnchorRow(anchor.name, anchor.symbol, Status.SKIPPED, message=f"applies to torch {guide.torch}")
                )
                continue
            drift = workspace.drift(guide, anchor)
            if drift.kind is DriftKind.OTHER_TORCH:
                row.anchors.append(AnchorRow(anchor.name, anchor.symbol, Status.SKIPPED, message=drift.summary))
                continue
            row.anchors.append(anchor_row(guide, anchor, Status.PASSED if drift.ok else Status.FAILED, drift))
    for guide_row in report.guides:
        for found in guide_row.anchors:
            if found.outcome is Status.FAILED:
                console.print(drift_panel(guide_row, found))
    outcome = Outcome.BROKEN if opened.broken else Outcome.REREAD if report.drifted else Outcome.CLEAN
    report.claims_not_run = "`fsdp-readings drift` compares the source only; `pytest readings/` runs them"
    report.outcome, report.fail_on = outcome.value, args.fail_on
    code = report.exit_code = exit_code(outcome, args.fail_on)
    console.print(summary(report, claims=False))
    if args.report is not None:
        json_path, md_path = write_drift_report(args.report, report)
        console.print(f"drift report: {display(json_path)}, {display(md_path)}")
    workspace.source.close()
    return code


def _refused(args: argparse.Namespace) -> SessionReport:
    """The report of a command that never opened its guides or its torch (printed to the console already)."""
    why = "the guides or the torch source could not be opened (the command's output says why)"
    report = SessionReport(None, None, str(args.torch_source or "installed torch"), "", broken=[why])
    report.outcome, report.exit_code, report.claims_not_run = Outcome.BROKEN.value, BROKEN, why
    return report


APPROVE_EXAMPLES = """examples:
  fsdp-readings approve 03-unshard-reshard     after re-reading it: claims run, then it is recorded
  fsdp-readings approve                        the one guide whose anchors drift (several: listed)
  fsdp-readings approve --matrix 2.13,2.15     keep each release's approvals, for a CI matrix
  fsdp-readings approve 18-fsdp2-reshard-and-gradients --force "2.15 reduces in fp32; guide re-read"

A guide is recorded whole or not at all, on the installed torch (never on a --torch-source preview).
exit status: 0 approved (or nothing to approve), 1 refused: a claim failed (--force records it
anyway, with the reason), 6 refused: an anchor cannot be pinned (removed, a lost pattern or note:
re-read and repin it), 2 broken input"""


def configure_approve(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = APPROVE_EXAMPLES
    add_common(parser)
    parser.add_argument(
        "--matrix",
        metavar="RELEASES",
        type=_releases,
        help="keep the approvals of these torch releases, comma-separated (e.g. 2.13,2.15), so that every leg of "
        "a CI matrix passes; stored in the lock. An empty string drops the matrix",
    )
    parser.add_argument(
        "--force",
        metavar="REASON",
        type=_force,
        help="approve although a claim failed or did not run, for this reason (kept in the lock beside them)",
    )
    pool_options(parser)


def _releases(text: str) -> tuple[str, ...]:
    try:
        return tuple(release(r) for r in text.split(",") if r.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _force(text: str) -> str:
    try:
        reason = force_reason(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    assert reason is not None
    return reason


@guarded
def run_approve(args: argparse.Namespace, console: Console) -> int:
    """Approve guides on the installed torch: each one's claims run here first, and it is recorded whole, or not at
    all. Without ids, the one guide whose anchors drift; several are listed for the person to name."""
    if args.torch_source is not None:
        raise CommandProblem(
            f"approve records what ran on the installed torch; nothing runs on --torch-source {args.torch_source} "
            "(its claims cannot)",
            "install that torch in a venv and approve there",
        )
    opened = open_session(args, console)
    workspace, report = opened.workspace, opened.report
    if args.matrix is not None:
        for said in workspace.set_matrix(args.matrix):
            console.print(said)
        console.print(f"torch matrix: {', '.join(workspace.lock.matrix) or 'none (the newest approval wins)'}")
    try:
        guides = _to_approve(opened.guides, workspace, console) if not args.guide_ids else opened.guides
    except CommandProblem:
        workspace.source.close()
        raise
    outcomes = [Outcome.BROKEN] if opened.broken else []
    with claim_runner(opened, args) as runner:
        for guide in sorted(guides, key=lambda g: (g.order, g.id)):
            outcomes.append(_approve_one(guide, workspace, runner, force=args.force, report=report, console=console))
    if not args.guide_ids and not opened.broken:
        # Approving without ids covers every guide: entries of guides that no longer exist are stale.
        for key in workspace.prune_missing_guides({g.id for g in opened.guides}):
            console.print(f"dropped stale lock entry {key}")
    wrote = workspace.save()
    outcome = worst(outcomes)
    report.outcome, report.exit_code = outcome.value, outcome.code
    console.print(summary(report, claims=False))
    console.print(f"{'wrote' if wrote else 'unchanged:'} {display(workspace.lock_path)}")
    return outcome.code


def _to_approve(guides: list[Guide], workspace: Workspace, console: Console) -> list[Guide]:
    """A bare ``approve``: the guide whose anchors drift on this torch; with several, `CommandProblem` listing
    them (each is approved on its own, after it is re-read)."""
    pending = {g.id: d for g in guides if g.applies_to(workspace.torch_version) and (d := workspace.pending(g))}
    if len(pending) > 1:
        listed = [f"  fsdp-readings approve {gid}    # {', '.join(_named(d) for d in drifts)}"
                  for gid, drifts in sorted(pending.items())]  # fmt: skip
        raise CommandProblem(
            "\n".join([f"{len(pending)} guides to approve on torch {workspace.torch_version}; re-read each, then "
                       "approve it by id (nothing was written):", *listed]),
            "approve one guide at a time, by its id, once you have re-read it",
        )  # fmt: skip
    if not pending:
        console.print(f"nothing to approve: every anchor reads as approved on torch {workspace.torch_version}")
    return [g for g in guides if g.id in pending]


def _named(drift: Drift) -> str:
    return f"{drift.anchor.name} ({drift.kind.value})"


def _approve_one(
    guide: Guide,
    workspace: Workspace,
    runner: ClaimRunner,
    *,
    force: str | None,
    report: SessionReport,
    console: Console,
) -> Outcome:
    """Run the guide's claims, then record it whole: clean, or (with every reason printed) why it was refused:
    a claim failed (behaviour changed), an anchor cannot be pinned (re-read), or this torch cannot be approved on
    (broken: an unknown version, or a release outside the lock's matrix)."""
    row = report.guide(guide.id, display(guide.path), guide.title)
    if not guide.applies_to(workspace.torch_version):
        console.print(f"{guide.id} applies to torch {guide.torch}; this torch is {workspace.torch_version}: skipped")
        return Outcome.CLEAN
    try:
        drifts = workspace.check_approvable(guide)
        read = guide.on(workspace.torch_version)
        with console.status(f"running the claims of {guide.id}…", spinner="dots"):
            results = {claim.id: runner.verdict(read, claim) for claim in guide.claims}
        approval = workspace.approve_guide(guide, results, force=force)
    except NotApprovable as exc:
        for drift in exc.drifts:
            row.anchors.append(anchor_row(guide, drift.anchor, Status.FAILED, drift))
            console.print(drift_panel(row, row.anchors[-1]))
        report.refused += [f"{guide.id}: {reason}" for reason in exc.reasons]
        return Outcome.BEHAVIOUR if exc.forceable else Outcome.REREAD if exc.drifts else Outcome.BROKEN
    for drift in drifts:
        if drift.diff and drift.kind not in (DriftKind.UNCHANGED, DriftKind.MOVED):
            console.print(f"[bold]{drift.key}[/]: approving {drift.kind.value}")
            console.print(drift.diff, markup=False, highlight=False)
    for anchor in approval.anchors:
        was = anchor.drift.kind
        row.anchors.append(anchor_row(guide, anchor.drift.anchor, Status.APPROVED, anchor.drift))
        if was is not DriftKind.UNCHANGED:  # an unchanged entry is not touched: nothing to list
            report.approved.append(
                f"{anchor.drift.key} (was: {was.value}; torch {', '.join(anchor.source.approved_on)})"
            )
    record = approval.record
    held = f"{record.held} of {len(guide.claims)} claims held" + (
        f", {len(record.skipped)} skipped here ({', '.join(record.skipped)})" if record.skipped else ""
    )
    forced = f"; forced over {', '.join((*record.failed, *record.not_run))}: {record.forced}" if record.forced else ""
    report.approved.append(f"{guide.id} on torch {approval.release}: {held}{forced}")
    for key in approval.pruned:
        console.print(f"dropped stale lock entry {key}")
    return Outcome.CLEAN


LIST_EXAMPLES = """examples:
  fsdp-readings list                          every guide, in reading order, and where you stand on each
  fsdp-readings list 06-backward-prefetch     one guide
  fsdp-readings --readings ~/src/fsdp-readings/readings list

columns: anchors (drift of the torch code each guide quotes, on this torch), claims (results of the last run of
each claim on this torch: pytest readings/, check, predict and the views record them; "not run" until then),
predict (questions answered right the first time, of those answered) and exercises (the same)"""

WIDE = 100  # from this width the list is a table; below it, two lines per guide


def configure_list(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = LIST_EXAMPLES
    add_common(parser)


@guarded
def run_list(args: argparse.Namespace, console: Console) -> int:
    """The guides in reading order, each with where it stands: its anchors' drift on this torch, how many of its
    claims held when they last ran on this torch, the predict score and the exercises solved."""
    session = open_session(args, console)
    try:
        progress: Progress | None = Progress()
    except ProgressError as exc:
        console.print(f"[yellow]{exc}[/]")
        progress = None
    torch = session.workspace.torch_version
    checks = CheckFinder(extra_paths=[args.readings.resolve().parent])
    rows = []
    for guide in sorted(session.guides, key=lambda g: (g.order, g.id)):
        modules = exercise_modules(claim.check.split(":")[0] for claim in guide.claims)
        statuses = (
            ("anchors", _anchor_status(session.workspace, guide)),
            ("claims", _claim_status(guide, progress, torch)),
            ("predict", _score(len(guide.regions_of(PredictQuestion)), progress, guide.id, "predict")),
            ("exercises", _score(sum(map(checks.exercise_count, modules)), progress, guide.id, "exercises")),
        )
        rows.append((guide, statuses))
    title = f"Reading guides · torch {torch}"
    console.print(
        _list_table(title, rows) if console.width >= WIDE else _list_lines(title, rows, console.width), soft_wrap=False
    )
    # Wrapped to the console's width, piped or not, like the rows above it.
    console.print(_release_status(session.workspace, [guide.id for guide in session.guides]), soft_wrap=False)
    return BROKEN if session.broken else CLEAN


def _release_status(workspace: Workspace, guide_ids: list[str]) -> Text:
    """Whether the installed torch is an approved release: one every guide was re-read and approved on (its
    claims passing there), and which releases are. A lock that cannot be read is reported by the anchors column."""
    try:
        lock = workspace.lock
    except LockError:
        return Text("")
    try:
        here = release(workspace.torch_version)
    except ValueError:
        here = workspace.torch_version
    on_every = set.intersection(*(set(lock.releases_of(g)) for g in guide_ids)) if guide_ids else set()
    releases = ", ".join(sorted_releases(on_every)) or "none"
    if here in on_every:
        return Text.assemble((f"torch {here} is an approved release", "green"), f": every guide was re-read and "
                             f"approved on it, its claims passing. Approved releases: {releases}.")  # fmt: skip
    missing = [g for g in guide_ids if here not in lock.releases_of(g)]
    which = "no guide" if len(missing) == len(guide_ids) else f"{len(missing)} of {len(guide_ids)} guides"
    return Text.assemble(
        (f"torch {here} is not an approved release", "yellow"),
        f" ({which} approved on it). Approved releases: {releases}. `fsdp-readings drift` shows what its source "
        "changed; the claims re-prove the behaviour.",
    )


def _list_table(title: str, rows: list[tuple[Guide, tuple[tuple[str, Text], ...]]]) -> Table:
    table = Table(title=title, title_justify="left", expand=True)
    longest = max((len(guide.id) for guide, _ in rows), default=10)
    table.add_column("guide", ratio=1, min_width=longest)
    for column, _ in rows[0][1] if rows else ():
        table.add_column(column, justify="right", no_wrap=True)
    for guide, statuses in rows:
        name = Text.assemble((guide.id, "bold"), "\n", (guide.title, "dim"))
        table.add_row(name, *(status for _, status in statuses))
    return table


def _list_lines(title: str, rows: list[tuple[Guide, tuple[tuple[str, Text], ...]]], width: int) -> Group:
    """A few lines a guide: its id, then (indented, wrapping at words) its title and its labelled statuses."""
    lines: list[Text] = [Text(title, style="bold")]
    for guide, statuses in rows:
        labelled = [Text.assemble((f"{label} ", "dim"), value) for label, value in statuses]
        lines += [Text(guide.id, style="bold"), indented(guide.title, width, "dim"), items_line(labelled, width)]
    return Group(*lines)


def _anchor_status(workspace: Workspace, guide: Guide) -> Text:
    if not guide.anchors:
        return Text("none", style="dim")
    drifted = sum(1 for anchor in guide.anchors if not workspace.drift(guide, anchor).ok)
    if drifted:
        return Text(f"{drifted}/{len(guide.anchors)} drifted", style="red")
    return Text(f"{len(guide.anchors)} ok", style="green")


def _claim_status(guide: Guide, progress: Progress | None, torch: str | None) -> Text:
    """Claims that held (passed, or failed as their xfail expects) of the guide's claims, in their last run on this
    torch, and how many failed or have not run there ("5/12 (7 not run)"); "not run" when none has run on it."""
    if not guide.claims:
        return Text("none", style="dim")
    last = progress.claims(guide.id, torch) if progress else {}
    ran = [last[c.id] for c in guide.claims if c.id in last]
    if not ran:
        return Text("not run", style="dim")
    held, failed = tally(ran)
    not_run = len(guide.claims) - len(ran)
    shown = f"{held}/{len(guide.claims)}" + "".join(
        f" ({count} {what})" for count, what in ((failed, "failed"), (not_run, "not run")) if count
    )
    return Text(shown, style="red" if failed else "green" if not not_run else "")


def _score(items: int, progress: Progress | None, guide_id: str, section: Section) -> Text:
    """Right the first time, of those tried; "none" when the guide has none, "not tried" before the first."""
    if not items:
        return Text("none", style="dim")
    right, tried = progress.score(guide_id, section) if progress else (0, 0)
    if not tried:
        return Text("not tried", style="dim")
    return Text(f"{right}/{tried}", style="green" if right == tried else "")


SHOW_EXAMPLES = """examples:
  fsdp-readings show 06-backward-prefetch                  the guide, its torch source quoted live
  fsdp-readings show 06-backward-prefetch --answers        with its predict questions' answers
  FORCE_COLOR=1 fsdp-readings show 06-backward-prefetch | less -R      page through it, in colour

--answers reveals the answers: predict questions answered after that are practice, and do not score"""


def configure_show(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = SHOW_EXAMPLES
    parser.add_argument("guide_ids", nargs="+", metavar="GUIDE_ID", help="the guides to show (at least one)")
    parser.add_argument(
        "--torch-source",
        metavar="PATH",
        default=None,
        help="quote a torch wheel (read in place), site-packages dir or checkout instead of the installed torch",
    )
    parser.add_argument("--answers", action="store_true", help="show the predict questions' answers too")


@guarded
def run_show(args: argparse.Namespace, console: Console) -> int:
    session = open_session(args, console)
    guides = sorted(session.guides, key=lambda g: (g.order, g.id))
    if args.answers:
        _reveal_answers(guides, console)
    for guide in guides:
        # As read on this torch: blocks and notes scoped to other releases are not shown.
        print_guide(console, guide.on(session.workspace.torch_version), session.workspace, answers=args.answers)
    if len(guides) == 1:
        print_next(console, args.readings, guides[0].id, session.guide_ids)
    return BROKEN if session.broken else CLEAN


def _reveal_answers(guides: list[Guide], console: Console) -> None:
    """Answers seen are answers known: later predict attempts of these questions are practice."""
    try:
        progress = Progress()
    except ProgressError as exc:
        console.print(f"[yellow]{exc}[/]")
        return
    for guide in guides:
        progress.reveal(guide.id, [q.id for q in guide.regions_of(PredictQuestion)])
    progress.save()
