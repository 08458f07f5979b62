"""``fsdp-readings timeline GUIDE CLAIM``: what one claim's check made FSDP do, row by row in issue order, each row
naming the torch line that issued it and marked where that line is code the guide quotes.

The claim runs exactly as ``check`` runs it (`reader.study.runner.ClaimRunner`, which asks
`reader.claims.verdict.decide`) with one difference: its request asks the ranks to capture
(``CheckRequest.capture``), so every ``record_events`` / ``record_comm`` block of the check comes back with source
lines, whatever the check itself returns. `reader.views.lanes` turns those logs into rows.
"""

from __future__ import annotations

import argparse
import tomllib
from dataclasses import replace
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from checks.ranks.protocol import CheckRequest, CheckRun
from reader.claims.verdict import ClaimVerdict
from reader.format.errors import CommandProblem
from reader.format.guide import ClaimSpec, Guide
from reader.study.runner import ClaimRunner, pick_claims, refuse_view, remember
from reader.study.session import CLEAN, DRIFT, Session, open_session
from reader.views.lanes import Row, Span, iterations, rows
from reader.views.problem import guarded
from reader.views.timeline import header, rank_view

FAILED = DRIFT  # exit 1: the claim failed, or its check recorded nothing to draw

EXAMPLES = """examples:
  fsdp-readings timeline 04-forward-prefetch follows-iteration-1-order --iteration 2
  fsdp-readings timeline 01-step-map same-on-every-rank --all-ranks     events and collectives
  fsdp-readings timeline 08-post-backward-reduce-scatter reduce-scatter-in-post-backward --rank 1
  fsdp-readings timeline 17-fsdp2-prefetch order-of-this-step --recording 2    one of a check's recordings
  fsdp-readings timeline 06-backward-prefetch pre-prefetches-reverse-post-forward \
      --compare post-prefetches-after-free                     two claims (two modes), side by side
  fsdp-readings timeline 06-backward-prefetch model-predicts-gpt --compare workload=toy     a kwarg, two values

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
    parser.add_argument(
        "--recording", type=int, default=None, metavar="N", help="only the check's N-th recording (default: all)"
    )
    parser.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="CLAIM|KEY=V1,V2",
        help="also run another claim of the guide, or this claim with a kwarg set to each value, and draw them "
        "side by side (repeatable)",
    )
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto", help="default: auto")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before the claim's ranks are stopped")


@guarded
def run(args: argparse.Namespace, console: Console) -> int:
    args.guide_ids, args.torch_source = [args.guide], None
    session = open_session(args, console)  # an unknown guide is reported there, with the known ones
    try:
        return _run(args, console, session, session.guides[0])
    finally:
        session.workspace.source.close()


def _run(args: argparse.Namespace, console: Console, session: Session, guide: Guide) -> int:
    known = [c.id for c in guide.claims]
    (claim,) = pick_claims(guide, [args.claim])
    for wanted in [args.claim, *(c for c in args.compare if "=" not in c and c in known)]:
        refuse_view(guide, wanted, "timeline")
    if not args.all_ranks and not 0 <= args.rank < claim.world_size:
        raise CommandProblem(f"no rank {args.rank}: {claim.id} runs on ranks 0-{claim.world_size - 1}",
                             f"give --rank one of 0-{claim.world_size - 1}, or --all-ranks")  # fmt: skip
    variants = compared(guide, claim, args.compare)
    drawn: list[tuple[str, dict[int, list[Row]], Any]] = []
    failures: list[tuple[str, str | None]] = []
    backend = "unknown backend"
    for title, variant, overrides in variants:
        with console.status(f"running claim {variant.id} with capture…", spinner="dots"):
            verdict, backend = captured_verdict(session, guide, variant, args, overrides)
        if verdict.skipped:  # as pytest skips it: nothing to draw, nothing failed
            console.print(f"[yellow]{variant.id} skipped[/]: {verdict.skipped}", highlight=False)
            return CLEAN
        if verdict.outcome is None:
            console.print(f"[red]{variant.id} did not run[/]", soft_wrap=False)
            console.print(Text(verdict.failure or ""), soft_wrap=False)
            return FAILED
        timelines = {r.rank: rows(r.captured, quoted_spans(session, guide)) for r in verdict.outcome.results}
        if not any(timelines.values()):
            console.print(
                f"[red]{variant.id} captured nothing to draw[/]: its check opens no record_events or record_comm "
                f"block (checks.probes), or failed before one finished. Try another claim of {guide.id}.",
                soft_wrap=False,
            )
            _print_failure(console, variant.id, verdict.failure)
            return FAILED
        drawn.append((title, timelines, verdict.outcome))
        failures.append((variant.id, verdict.failure))
    shown = sorted(drawn[0][1]) if args.all_ranks else [args.rank]
    refuse_missing(args, shown, [timelines for _, timelines, _ in drawn])
    torch = session.workspace.torch_version or "unknown version"
    view = header(
        guide.id, claim.id, world_size=claim.world_size, ranks=shown, iteration=args.iteration, backend=backend,
        torch=torch,
    )  # fmt: skip
    console.print(view, soft_wrap=False)
    for rank in shown:
        views = []
        for title, timelines, outcome in drawn:
            result = next((r for r in outcome.results if r.rank == rank), None)
            picked = [r for r in timelines.get(rank, []) if _wanted(args, r)]
            views.append((title, rank_view(rank, picked, result.captured if result else [])))
        console.print(side_by_side(views, console.width), soft_wrap=False)
    for claim_id, failure in failures:
        _print_failure(console, claim_id, failure)
    return FAILED if any(failure for _, failure in failures) else CLEAN


SIDE_BY_SIDE = 70  # the narrowest a timeline drawn beside another may be


def side_by_side(views: list[tuple[str, RenderableType]], width: int) -> RenderableType:
    """One view as it is; several beside each other where each gets ``SIDE_BY_SIDE`` columns, else one after
    another, each under its title."""
    if len(views) == 1:
        return views[0][1]
    titled = [Group(Text(title, style="bold reverse"), view) for title, view in views]
    if width >= SIDE_BY_SIDE * len(views):
        grid = Table.grid(expand=True, padding=(0, 2))
        for _ in views:
            grid.add_column(ratio=1)
        grid.add_row(*titled)
        return grid
    return Group(*titled)


def compared(guide: Guide, claim: ClaimSpec, wanted: list[str]) -> list[tuple[str, ClaimSpec, dict[str, Any] | None]]:
    """The runs to draw: the claim itself, then each ``--compare`` (another claim of the guide, or this claim with
    ``KEY`` set to each value: values read as TOML, else as strings); `CommandProblem` for a ``--compare`` that
    names neither."""
    runs: list[tuple[str, ClaimSpec, dict[str, Any] | None]] = [(claim.id, claim, None)]
    for item in wanted:
        key, eq, values = item.partition("=")
        if not eq:
            if item not in {c.id for c in guide.claims}:
                raise CommandProblem(f"--compare {item}: {guide.id} has no such claim",
                                     f"name one of its claims: {', '.join(c.id for c in guide.claims)}")  # fmt: skip
            runs.append((item, guide.claim(item), None))
            continue
        if key not in claim.kwargs and not _accepts(claim, key):
            raise CommandProblem(f"--compare {item}: {claim.id} takes no kwarg `{key}`",
                                 f"set one of its kwargs: {', '.join(claim.kwargs) or 'none'}")  # fmt: skip
        if claim.id == runs[0][1].id and len(runs) == 1:
            runs[0] = (f"{claim.id} ({key}={_shown(claim.kwargs.get(key))})", claim, None)
        for value in values.split(","):
            runs.append((f"{claim.id} ({key}={value})", claim, {key: _value(value)}))
    return runs


def _accepts(claim: ClaimSpec, key: str) -> bool:
    """Whether the claim's check takes ``key`` (the check module is imported: this command runs it anyway)."""
    import importlib
    import inspect

    module, _, name = claim.check.partition(":")
    try:
        return key in inspect.signature(getattr(importlib.import_module(module), name)).parameters
    except (ImportError, AttributeError, ValueError, TypeError):
        return False


def _value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _shown(value: Any) -> str:
    return "its default" if value is None else str(value)


def _wanted(args: argparse.Namespace, row: Row) -> bool:
    return (args.iteration is None or row.iteration == args.iteration) and (
        args.recording is None or row.recording == args.recording
    )


def refuse_missing(args: argparse.Namespace, ranks: list[int], drawn: list[dict[int, list[Row]]]) -> None:
    """`CommandProblem` for what ``--recording`` / ``--iteration`` asked for that no run recorded, with what
    there is instead."""
    for timelines in drawn:
        present = [r for rank in ranks for r in timelines.get(rank, [])]
        recordings = sorted({r.recording for r in present})
        if args.recording is not None and args.recording not in recordings:
            raise CommandProblem(f"recording {args.recording} was not made (recordings: {_listed(recordings)})",
                                 "give --recording one that was made, or leave it out")  # fmt: skip
        kept = [r for r in present if args.recording is None or r.recording == args.recording]
        if args.iteration is not None and args.iteration not in iterations(kept):
            by_recording = {n: sorted({r.iteration for r in kept if r.recording == n}) for n in recordings}
            each = "; ".join(f"recording {n}: iteration(s) {_listed(its)}" for n, its in by_recording.items() if its)
            hint = (
                " Iterations are counted within each recording: --recording N draws one." if len(recordings) > 1 else ""
            )
            raise CommandProblem(f"iteration {args.iteration} was not recorded ({each or 'none'}).{hint}",
                                 "give --iteration one that was recorded, or leave it out")  # fmt: skip


def _listed(numbers: list[int]) -> str:
    return ", ".join(map(str, numbers)) or "none"


def captured_verdict(
    session: Session, guide: Guide, claim: ClaimSpec, args: argparse.Namespace, overrides: dict[str, Any] | None = None
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
        verdict = runner.verdict(guide, claim, overrides)
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
