"""``fsdp-readings timeline GUIDE CLAIM``: what one claim's check made FSDP do, row by row in issue order, each row
naming the torch line that issued it and marked where that line is code the guide quotes.

The claim runs exactly as ``check`` runs it (`reader.commands.runner.ClaimRunner`, which asks
`reader.claims.verdict.decide`) with one difference: its request asks the ranks to capture
(``CheckRequest.capture``), so every ``record_events`` / ``record_comm`` block of the check comes back with source
lines, whatever the check itself returns. `reader.views.lanes` turns those logs into rows.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from checks.ranks.protocol import CheckRequest, CheckRun
from reader.claims.verdict import ClaimVerdict
from reader.commands.runner import ClaimRunner, remember
from reader.commands.session import BROKEN, CLEAN, DRIFT, Session, open_session
from reader.format.guide import ClaimSpec, Guide
from reader.views.lanes import Span, iterations, rows
from reader.views.timeline import header, rank_view

FAILED = DRIFT  # exit 1: the claim failed, or its check recorded nothing to draw

EXAMPLES = """examples:
  fsdp-readings timeline 04-forward-prefetch follows-iteration-1-order --iteration 2
  fsdp-readings timeline 01-step-map same-on-every-rank --all-ranks     events and collectives
  fsdp-readings timeline 08-post-backward-reduce-scatter reduce-scatter-in-post-backward --rank 1

rows are in issue order (the probes' shared clock), not a picture of concurrency; a row marked ★ issued
from a line inside one of the guide's quoted anchors, named next to it.
exit status: 0 drawn and the claim passed, 1 the claim failed or its check records nothing,
2 broken input (unknown guide, claim, rank or iteration)"""


class CapturingManager:
    """Runs every request with ``capture=True`` on another manager: how the timeline reuses `ClaimRunner`
    unchanged (the runner builds the request; this adds the one flag on its way to the ranks)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def run(self, request: CheckRequest) -> CheckRun:
        return self.inner.run(replace(request, capture=True))

    def backend_for(self, world_size: int) -> str | None:
        backend_for = getattr(self.inner, "backend_for", None)
        return backend_for(world_size) if backend_for is not None else None


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXAMPLES
    parser.add_argument("guide", metavar="GUIDE", help="a guide id, e.g. 04-forward-prefetch")
    parser.add_argument("claim", metavar="CLAIM", help="a claim of that guide whose check records probes")
    ranks = parser.add_mutually_exclusive_group()
    ranks.add_argument("--rank", type=int, default=0, metavar="R", help="whose timeline to draw (default: 0)")
    ranks.add_argument("--all-ranks", action="store_true", help="draw every rank's timeline, one after another")
    parser.add_argument("--iteration", type=int, default=None, metavar="K", help="only iteration K (default: all)")
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto", help="default: auto")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before the claim's ranks are stopped")


def run(args: argparse.Namespace, console: Console) -> int:
    args.guide_ids, args.torch_source = [args.guide], None
    session = open_session(args, console)  # an unknown guide is reported there, with the known ones
    if isinstance(session, int):
        return session
    try:
        return _run(args, console, session, session.guides[0])
    finally:
        session.workspace.source.close()


def _run(args: argparse.Namespace, console: Console, session: Session, guide: Guide) -> int:
    known = [c.id for c in guide.claims]
    if args.claim not in known:
        console.print(f"[red]{guide.id} has no claim {args.claim}[/] (claims: {', '.join(known)})")
        return BROKEN
    claim = guide.claim(args.claim)
    if not args.all_ranks and not 0 <= args.rank < claim.world_size:
        console.print(f"[red]no rank {args.rank}[/]: {claim.id} runs on ranks 0-{claim.world_size - 1}")
        return BROKEN
    with console.status(f"running claim {claim.id} with capture…", spinner="dots"):
        verdict, backend = captured_verdict(session, guide, claim, args)
    outcome = verdict.outcome
    if verdict.skipped:  # as pytest skips it: nothing to draw, nothing failed
        console.print(f"[yellow]{claim.id} skipped[/]: {verdict.skipped}", highlight=False)
        return CLEAN
    if outcome is None:
        console.print(f"[red]{claim.id} did not run[/]", soft_wrap=False)
        console.print(Text(verdict.failure or ""), soft_wrap=False)
        return FAILED
    spans = quoted_spans(session, guide)
    timelines = {r.rank: rows(r.captured, spans) for r in sorted(outcome.results, key=lambda r: r.rank)}
    if not any(timelines.values()):
        console.print(
            f"[red]{claim.id} captured nothing to draw[/]: its check opens no record_events or record_comm block "
            f"(checks.probes), or failed before one finished. Try another claim of {guide.id}.",
            soft_wrap=False,
        )
        _print_failure(console, claim.id, verdict.failure)
        return FAILED
    shown = sorted(timelines) if args.all_ranks else [args.rank]
    if args.iteration is not None:
        recorded = sorted({k for rank in shown for k in iterations(timelines.get(rank, []))})
        if args.iteration not in recorded:
            console.print(
                f"[red]iteration {args.iteration} was not recorded[/] "
                f"(recorded: {', '.join(map(str, recorded)) or 'none'})"
            )
            _print_failure(console, claim.id, verdict.failure)
            return BROKEN
    torch = session.workspace.torch_version or "unknown version"
    view = header(
        guide.id, claim.id, world_size=claim.world_size, ranks=shown, iteration=args.iteration, backend=backend,
        torch=torch,
    )  # fmt: skip
    console.print(view, soft_wrap=False)
    by_rank = {r.rank: r for r in outcome.results}
    for rank in shown:
        result = by_rank.get(rank)
        drawn = [r for r in timelines.get(rank, []) if args.iteration is None or r.iteration == args.iteration]
        console.print(rank_view(rank, drawn, result.captured if result else []), soft_wrap=False)
    _print_failure(console, claim.id, verdict.failure)
    return FAILED if verdict.failure else CLEAN


def captured_verdict(
    session: Session, guide: Guide, claim: ClaimSpec, args: argparse.Namespace
) -> tuple[ClaimVerdict, str]:
    """The claim's verdict from a capturing run, and the backend it ran on. ``args.manager`` (a caller's
    PoolManager, e.g. the test session's pool) is used and left open; otherwise one is started and closed here.
    ``args.patches``: break-it patches, set in-process as for ``check``."""
    given = getattr(args, "manager", None)
    if given is None:
        from checks.ranks.manager import PoolManager  # starts no process until the claim runs

        inner: Any = PoolManager(backend=args.backend, timeout=args.timeout)
    else:
        inner = given
    manager = CapturingManager(inner)
    patches = tuple(getattr(args, "patches", ()))
    try:
        runner = ClaimRunner(session, args.backend, args.timeout, manager=manager, patches=patches)
        verdict = runner.verdict(guide, claim)
        remember(runner)
    finally:
        if given is None:
            inner.close()
    return verdict, manager.backend_for(claim.world_size) or "unknown backend"


def quoted_spans(session: Session, guide: Guide) -> list[Span]:
    """The line ranges of the anchors the guide quotes (a ``source`` fence), as the installed torch has them."""
    resolved, _ = session.workspace.resolutions(guide)
    quoted = {block.anchor for block in guide.source_blocks()}
    return [Span(name, r.relpath, r.start, r.end) for name, r in resolved.items() if name in quoted]


def _print_failure(console: Console, claim: str, failure: str | None) -> None:
    if failure:
        console.print(Panel(Text(failure), title=f"{claim} failed", border_style="red"), soft_wrap=False)
