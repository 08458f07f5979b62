"""The commands over guides and their anchors: ``list`` (where each guide stands), ``show`` (a guide with its torch
source quoted live), ``drift`` (anchors against the approved source) and ``approve`` (record the source read)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from reader.claims.progress import Progress, ProgressError
from reader.claims.verdict import ClaimVerdict, failure_summary
from reader.commands.runner import ClaimRunner, claim_runner, pool_options
from reader.commands.session import BROKEN, CLEAN, DRIFT, add_common, display, open_session
from reader.format.guide import ClaimSpec, Guide
from reader.gate.approval import ClaimResult, NotApprovable, force_reason
from reader.gate.drift import Drift, DriftKind
from reader.gate.drift_report import write_drift_report
from reader.gate.releases import release
from reader.gate.report import AnchorRow, SessionReport, anchor_row, drift_panel, summary
from reader.gate.workspace import Workspace
from reader.views.guide import print_guide


def configure_drift(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument(
        "--report",
        metavar="FILE",
        type=Path,
        default=None,
        help="also write the report as JSON to FILE and as Markdown next to it",
    )


def run_drift(args: argparse.Namespace, console: Console) -> int:
    opened = open_session(args, console)
    if isinstance(opened, int):
        return opened
    workspace, report = opened.workspace, opened.report
    for guide in opened.guides:
        row = report.guide(guide.id, display(guide.path), guide.title)
        applies = guide.applies_to(workspace.torch_version)
        for anchor in guide.anchors:
            if not applies:
                row.anchors.append(
                    AnchorRow(anchor.name, anchor.symbol, "skipped", message=f"applies to torch {guide.torch}")
                )
                continue
            drift = workspace.drift(guide, anchor)
            if drift.kind is DriftKind.OTHER_TORCH:
                row.anchors.append(AnchorRow(anchor.name, anchor.symbol, "skipped", message=drift.summary))
                continue
            row.anchors.append(anchor_row(guide, anchor, "passed" if drift.ok else "failed", drift))
    for guide_row in report.guides:
        for found in guide_row.anchors:
            if found.outcome == "failed":
                console.print(drift_panel(guide_row, found))
    code = BROKEN if opened.broken else DRIFT if report.drifted else CLEAN
    report.exit_code = code
    console.print(summary(report, claims=False))
    if args.report is not None:
        json_path, md_path = write_drift_report(args.report, report)
        console.print(f"drift report: {display(json_path)}, {display(md_path)}")
    workspace.source.close()
    return code


def configure_approve(parser: argparse.ArgumentParser) -> None:
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


def run_approve(args: argparse.Namespace, console: Console) -> int:
    """Approve guides on the installed torch: each one's claims run here first, and it is recorded whole, or not at
    all. Without ids, the one guide whose anchors drift; several are listed for the person to name."""
    if args.torch_source is not None:
        console.print(
            f"[red]approve records what ran on the installed torch; nothing runs on --torch-source "
            f"{args.torch_source}[/] (its claims cannot): install that torch in a venv and approve there"
        )
        return BROKEN
    opened = open_session(args, console)
    if isinstance(opened, int):
        return opened
    workspace, report = opened.workspace, opened.report
    if args.matrix is not None:
        for said in workspace.set_matrix(args.matrix):
            console.print(said)
        console.print(f"torch matrix: {', '.join(workspace.lock.matrix) or 'none (the newest approval wins)'}")
    guides = _to_approve(opened.guides, workspace, console) if not args.guide_ids else opened.guides
    if guides is None:
        workspace.source.close()
        return BROKEN
    refused = 0
    with claim_runner(opened, args) as runner:
        for guide in sorted(guides, key=lambda g: (g.order, g.id)):
            refused += not _approve_one(guide, workspace, runner, force=args.force, report=report, console=console)
    if not args.guide_ids and not opened.broken:
        # Approving without ids covers every guide: entries of guides that no longer exist are stale.
        for key in workspace.prune_missing_guides({g.id for g in opened.guides}):
            console.print(f"dropped stale lock entry {key}")
    wrote = workspace.save()
    console.print(summary(report, claims=False))
    console.print(f"{'wrote' if wrote else 'unchanged:'} {display(workspace.lock_path)}")
    return BROKEN if opened.broken else DRIFT if refused else CLEAN


def _to_approve(guides: list[Guide], workspace: Workspace, console: Console) -> list[Guide] | None:
    """A bare ``approve``: the guide whose anchors drift on this torch; with several, None (after listing them:
    each is approved on its own, after it is re-read)."""
    pending = {g.id: d for g in guides if g.applies_to(workspace.torch_version) and (d := workspace.pending(g))}
    if len(pending) > 1:
        console.print(f"[red]{len(pending)} guides to approve on torch {workspace.torch_version}[/]; re-read each, "
                      "then approve it by id (nothing was written):")  # fmt: skip
        for gid, drifts in sorted(pending.items()):
            console.print(f"  fsdp-readings approve {gid}    # {', '.join(_named(d) for d in drifts)}")
        return None
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
) -> bool:
    """Run the guide's claims, then record it whole; False (with every reason printed) when it is refused."""
    row = report.guide(guide.id, display(guide.path), guide.title)
    if not guide.applies_to(workspace.torch_version):
        console.print(f"{guide.id} applies to torch {guide.torch}; this torch is {workspace.torch_version}: skipped")
        return True
    try:
        drifts = workspace.check_approvable(guide)
        read = guide.on(workspace.torch_version)
        with console.status(f"running the claims of {guide.id}…", spinner="dots"):
            results = {claim.id: _gpu_skip(claim) or _result(runner.verdict(read, claim)) for claim in guide.claims}
        approval = workspace.approve_guide(guide, results, force=force)
    except NotApprovable as exc:
        for drift in exc.drifts:
            row.anchors.append(anchor_row(guide, drift.anchor, "failed", drift))
            console.print(drift_panel(row, row.anchors[-1]))
        report.refused += [f"{guide.id}: {reason}" for reason in exc.reasons]
        return False
    for drift in drifts:
        if drift.diff and drift.kind not in (DriftKind.UNCHANGED, DriftKind.MOVED):
            console.print(f"[bold]{drift.key}[/]: approving {drift.kind.value}")
            console.print(drift.diff, markup=False, highlight=False)
    for anchor in approval.anchors:
        was = anchor.drift.kind
        row.anchors.append(anchor_row(guide, anchor.drift.anchor, "approved", anchor.drift))
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
    return True


def _gpu_skip(claim: ClaimSpec) -> ClaimResult | None:
    """A claim marked ``gpu`` is skipped without one CUDA device per rank, as pytest's rank-pool plugin skips it."""
    if "gpu" not in claim.markers:
        return None
    from checks.ranks.backend import cuda_device_count  # imports torch: only when a gpu claim is asked about

    have = cuda_device_count()
    if have >= claim.world_size:
        return None
    return ClaimResult("skipped", f"needs {claim.world_size} CUDA device(s) for nccl (one per rank); {have} here")


def _result(verdict: ClaimVerdict) -> ClaimResult:
    if verdict.failure:
        reason, line = failure_summary(verdict)
        return ClaimResult(verdict.status.value, f"`{reason}` {line}")
    return ClaimResult(verdict.status.value, verdict.skipped or "")


def configure_list(parser: argparse.ArgumentParser) -> None:
    add_common(parser)


def run_list(args: argparse.Namespace, console: Console) -> int:
    """The guides in reading order, each with where it stands: its anchors' drift on this torch, how many of its
    claims passed when ``check`` last ran them, the predict score and the exercises solved."""
    session = open_session(args, console)
    if isinstance(session, int):
        return session
    try:
        progress: Progress | None = Progress()
    except ProgressError as exc:
        console.print(f"[yellow]{exc}[/]")
        progress = None
    table = Table(title=f"Reading guides · torch {session.workspace.torch_version}", title_justify="left", expand=True)
    table.add_column("guide", ratio=1, overflow="fold")
    for column in ("anchors", "claims", "predict", "exercises"):
        table.add_column(column, justify="right", no_wrap=True)
    for guide in sorted(session.guides, key=lambda g: (g.order, g.id)):
        table.add_row(
            Text.assemble((guide.id, "bold"), "\n", (guide.title, "dim")),
            _anchor_status(session.workspace, guide),
            _claim_status(guide, progress),
            _score(progress.score(guide.id) if progress else (0, 0)),
            _score(progress.score(guide.id, "exercises") if progress else (0, 0)),
        )
    console.print(table, soft_wrap=False)
    return BROKEN if session.broken else CLEAN


def _anchor_status(workspace: Workspace, guide: Guide) -> Text:
    if not guide.anchors:
        return Text("-", style="dim")
    drifted = sum(1 for anchor in guide.anchors if not workspace.drift(guide, anchor).ok)
    if drifted:
        return Text(f"{drifted}/{len(guide.anchors)} drifted", style="red")
    return Text(f"{len(guide.anchors)} ok", style="green")


def _claim_status(guide: Guide, progress: Progress | None) -> Text:
    last = progress.claims(guide.id) if progress else {}
    ran = [last[c.id] for c in guide.claims if c.id in last]
    if not guide.claims:
        return Text("-", style="dim")
    if not ran:
        return Text(f"0/{len(guide.claims)}", style="dim")
    failed = ran.count("failed")
    held = len(ran) - failed - ran.count("skipped")  # passed, or failing as their xfail expects
    shown = f"{held}/{len(guide.claims)}" + (f" ({failed} failed)" if failed else "")
    return Text(shown, style="red" if failed else "green")


def _score(right_of: tuple[int, int]) -> Text:
    right, tried = right_of
    return (
        Text(f"{right}/{tried}", style="green" if tried and right == tried else "") if tried else Text("-", style="dim")
    )


def configure_show(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument("--answers", action="store_true", help="show the predict questions' answers too")


def run_show(args: argparse.Namespace, console: Console) -> int:
    if not args.guide_ids:
        console.print("[red]name the guide to show[/] (fsdp-readings list shows them)")
        return BROKEN
    session = open_session(args, console)
    if isinstance(session, int):
        return session
    for guide in sorted(session.guides, key=lambda g: (g.order, g.id)):
        # As read on this torch: blocks and notes scoped to other releases are not shown.
        print_guide(console, guide.on(session.workspace.torch_version), session.workspace, answers=args.answers)
    return BROKEN if session.broken else CLEAN
