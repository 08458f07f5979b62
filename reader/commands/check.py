"""``fsdp-readings check GUIDE [CLAIM ...]``: run a guide's claims on the rank pool, and remember the results."""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from reader.claims.progress import Progress as Scores
from reader.claims.progress import ProgressError
from reader.claims.verdict import ClaimVerdict
from reader.commands.runner import FAILED, claim_runner, one_guide, pick_claims, pool_options
from reader.commands.session import BROKEN, CLEAN
from reader.format.guide import ClaimSpec, Guide

EXAMPLES = """examples:
  fsdp-readings check 04-forward-prefetch                   every claim of guide 04, on the rank pool
  fsdp-readings check 04-forward-prefetch stale-order-after-change
  fsdp-readings check 03-unshard-reshard --backend gloo --timeout 120

exit status: 0 every claim passed, 1 a claim failed, 2 broken input (unknown guide or claim)"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXAMPLES
    parser.add_argument("guide", metavar="GUIDE", help="a guide id, e.g. 04-forward-prefetch")
    parser.add_argument("claims", nargs="*", metavar="CLAIM", help="claim ids (default: every claim but slow ones)")
    parser.add_argument("--slow", action="store_true", help="with no CLAIM, also run claims marked slow")
    pool_options(parser)


def run(args: argparse.Namespace, console: Console) -> int:
    opened = one_guide(args, console)
    if isinstance(opened, int):
        return opened
    session, guide = opened
    claims = pick_claims(guide, args.claims, console)
    if claims is None:
        return BROKEN
    if not args.claims and not args.slow:  # a claim named on the command line runs, slow or not
        slow = [c.id for c in claims if "slow" in c.markers]
        claims = [c for c in claims if "slow" not in c.markers]
        if slow:
            console.print(f"[dim]not running {len(slow)} slow claim(s) ({', '.join(slow)}): --slow runs them[/]")
    rows: list[tuple[ClaimSpec, ClaimVerdict, float]] = []
    with claim_runner(session, args) as runner, _progress(console) as progress:
        task = progress.add_task(guide.id, total=len(claims))
        for claim in claims:
            progress.update(task, description=claim.id)
            started = time.monotonic()
            rows.append((claim, runner.verdict(guide, claim), time.monotonic() - started))
            progress.advance(task)
    console.print(_results(guide, rows), soft_wrap=False)
    _remember_claims(guide, rows, console)
    for claim, verdict, _ in rows:
        if verdict.failure:
            console.print(Panel(Text(verdict.failure), title=f"{claim.id} failed", border_style="red"), soft_wrap=False)
    counts = Counter(v.status.value for _, v, _ in rows)
    shown = [s for s in ("passed", "xfailed", "xpassed", "skipped", "failed") if counts[s] or s in ("passed", "failed")]
    console.print(", ".join(f"{counts[s]} {s}" for s in shown))
    return FAILED if counts["failed"] else CLEAN


def _remember_claims(guide: Guide, rows: list[tuple[ClaimSpec, ClaimVerdict, float]], console: Console) -> None:
    """The last result of each claim, for ``fsdp-readings list``."""
    try:
        scores = Scores()
    except ProgressError as exc:
        console.print(f"[yellow]{exc}[/]")
        return
    for claim, verdict, _ in rows:
        scores.record_claim(guide.id, claim.id, _result(verdict))
    scores.save()


def _result(verdict: ClaimVerdict) -> str:
    return verdict.status.value


@contextmanager
def _progress(console: Console) -> Iterator[Progress]:
    columns = (TextColumn("{task.description}"), BarColumn(bar_width=30), MofNCompleteColumn())
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
        yield progress


RESULT_STYLES = {"skipped": "yellow", "failed": "red", "passed": "green", "xfailed": "cyan", "xpassed": "yellow"}


def _results(guide: Guide, rows: list[tuple[ClaimSpec, ClaimVerdict, float]]) -> Table:
    table = Table(title=f"claims of {guide.id}", title_justify="left", expand=True)
    table.add_column("claim", ratio=3, overflow="fold")
    table.add_column("ranks", justify="right")
    table.add_column("result")
    table.add_column("s", justify="right")
    for claim, verdict, seconds in rows:
        result = _result(verdict)
        style = RESULT_STYLES[result]
        shown = Text(result.upper() if result == "failed" else result, style=style)
        table.add_row(claim.id, str(claim.world_size), shown, f"{seconds:.1f}")
    return table
