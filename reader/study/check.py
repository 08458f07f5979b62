"""``fsdp-readings check GUIDE [CLAIM ...]``: run a guide's claims on the rank pool, and remember the results."""

from __future__ import annotations

import argparse
import pprint
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.text import Text

from reader.claims.status import Status
from reader.claims.verdict import ClaimVerdict
from reader.format.guide import ClaimSpec, Guide
from reader.study.answers import interrupted
from reader.study.runner import FAILED, claim_runner, one_guide, pick_claims, pool_options
from reader.study.session import CLEAN
from reader.views.fit import fitted, indented, plain_code
from reader.views.path import print_next
from reader.views.problem import guarded

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


@guarded
def run(args: argparse.Namespace, console: Console) -> int:
    session, guide = one_guide(args, console)
    claims = pick_claims(guide, args.claims)
    if not args.claims and not args.slow:  # a claim named on the command line runs, slow or not
        slow = [c.id for c in claims if "slow" in c.markers]
        claims = [c for c in claims if "slow" not in c.markers]
        if slow:
            console.print(f"[dim]not running {len(slow)} slow claim(s) ({', '.join(slow)}): --slow runs them[/]")
    rows: list[tuple[ClaimSpec, ClaimVerdict, float]] = []
    stopped = False
    try:
        with claim_runner(session, args, console=console) as runner, _progress(console) as progress:
            task = progress.add_task(guide.id, total=len(claims))
            for claim in claims:
                progress.update(task, description=claim.id)
                started = time.monotonic()
                rows.append((claim, runner.verdict(guide, claim), time.monotonic() - started))
                progress.advance(task)
    except KeyboardInterrupt:  # the runner closed its pool and recorded what finished
        stopped = True
    if rows:
        console.print(_results(guide, rows, console.width), soft_wrap=False)
    for claim, verdict, _ in rows:
        if verdict.failure:
            console.print(Panel(Text(verdict.failure), title=f"{claim.id} failed", border_style="red"), soft_wrap=False)
    counts = Counter(v.status for _, v, _ in rows)
    shown = [s for s in SHOWN if counts[s] or s in (Status.PASSED, Status.FAILED)]
    console.print(", ".join(f"{counts[s]} {s}" for s in shown))
    if stopped:
        return interrupted(console, f"{len(rows)} of {len(claims)} claims ran; their results are kept")
    print_next(console, args.readings, guide.id, session.guide_ids)
    return FAILED if counts[Status.FAILED] else CLEAN


@contextmanager
def _progress(console: Console) -> Iterator[Progress]:
    columns = (TextColumn("{task.description}"), BarColumn(bar_width=30), MofNCompleteColumn())
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
        yield progress


SHOWN = (Status.PASSED, Status.XFAILED, Status.XPASSED, Status.SKIPPED, Status.FAILED)  # in the closing count
RESULT_STYLES = {Status.SKIPPED: "yellow", Status.FAILED: "red", Status.PASSED: "green", Status.XFAILED: "cyan",
                 Status.XPASSED: "yellow"}  # fmt: skip


MEASURED = 240  # characters of what a claim's check returned, shown under it


def _results(guide: Guide, rows: list[tuple[ClaimSpec, ClaimVerdict, float]], width: int) -> RenderableType:
    """A block per claim: result, ranks and the seconds its check ran in the ranks, then the claim id (whole: it
    moves to a line of its own where it does not fit); under it the claim's sentence and what its check returned
    on rank 0 (or why it was skipped). The time of starting the pools, which the first claim of each world size
    waits for, is given apart, under the blocks."""
    lines: list[Text] = [Text(f"claims of {guide.id}", style="bold")]
    overhead = 0.0
    for claim, verdict, seconds in rows:
        result = verdict.status
        in_ranks = _check_seconds(verdict)
        overhead += max(0.0, seconds - (in_ranks or 0.0))
        timing = f"{in_ranks:5.1f} s" if in_ranks is not None else "    - "
        head = Text.assemble(
            ((result.upper() if result is Status.FAILED else result).ljust(8), RESULT_STYLES[result]),
            f"{claim.world_size} ranks  {timing}  ",
        )
        lines.append(fitted(head, claim.id, width))
        lines.append(indented(plain_code(claim.statement), width, indent="    "))
        if verdict.skipped:
            lines.append(indented(f"skipped: {verdict.skipped}", width, "yellow", indent="    "))
        elif (shown := _measured(verdict)) is not None:
            lines.append(indented(f"measured: {shown}", width, "dim", indent="    "))
    total = sum(seconds for _, _, seconds in rows)
    lines.append(
        indented(
            f"{total:.1f} s in all: {total - overhead:.1f} s in the claims' checks (the times above), "
            f"{overhead:.1f} s starting rank pools and passing messages",
            width,
            "dim",
            indent="",
        )
    )
    return Group(*lines)


def _check_seconds(verdict: ClaimVerdict) -> float | None:
    """How long the check ran in its slowest rank (pool start-up excluded); None when it did not run."""
    results = verdict.outcome.results if verdict.outcome is not None else []
    return max((r.duration for r in results), default=None) if results else None


def _measured(verdict: ClaimVerdict) -> str | None:
    """Rank 0's returned value, compact and cut at a word, for a claim whose check returned one."""
    if verdict.outcome is None or not verdict.outcome.ok:
        return None
    value = verdict.measured
    if value is None:
        return None
    text = " ".join(pprint.pformat(value, width=10_000, sort_dicts=False, compact=True).split())
    if len(text) <= MEASURED:
        return text
    return text[: text.rfind(" ", 0, MEASURED)] + " ..."
