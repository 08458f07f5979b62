"""``fsdp-readings memory GUIDE CLAIM``: the bytes each rank holds per category over one step, drawn from a real
run of a claim whose check records a memory series (`checks.probes.memory_series`).

The check returns ``{"series": {label: [(moment, {category: bytes}), ...]}, ...}``; this view draws each label's
series as rows of stacked bars in the terminal and, with ``--svg FILE``, as an SVG whose every bar carries its
exact bytes (``data-bytes``), so the picture's numbers are the probe's numbers.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.text import Text

from reader.study.runner import pool_options, run_for_rank
from reader.study.session import CLEAN, DRIFT
from reader.views.memory import Series, extras, picture, svg
from reader.views.problem import guarded

EXAMPLES = """examples:
  fsdp-readings memory 03-unshard-reshard memory-over-the-step
  fsdp-readings memory 03-unshard-reshard memory-over-the-step --svg memory.svg --rank 1

the claim's check must record a memory series; the SVG's bars carry their exact bytes"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXAMPLES
    parser.add_argument("guide", metavar="GUIDE", help="a guide id, e.g. 03-unshard-reshard")
    parser.add_argument("claim", metavar="CLAIM", help="a claim whose check records a memory series")
    parser.add_argument("--rank", type=int, default=0, help="whose memory to draw (default: rank 0)")
    parser.add_argument("--svg", type=Path, default=None, metavar="FILE", help="also write the picture as SVG")
    pool_options(parser)


@guarded
def run(args: argparse.Namespace, console: Console) -> int:
    reading = run_for_rank(args, console, "memory")
    if reading is None:
        return CLEAN
    guide, verdict, value = reading.guide, reading.verdict, reading.value
    series: Series | None = value.get("series") if isinstance(value, dict) else None
    if not series:
        console.print(f"[red]{args.claim} records no memory series[/] (its check returns no `series`)")
        return DRIFT
    console.print(picture(series, f"{guide.id} · {args.claim} · rank {args.rank}"), soft_wrap=False)
    for line in extras(value):
        console.print(line, soft_wrap=False)
    if args.svg is not None:
        args.svg.write_text(svg(series, f"{guide.id} · {args.claim} · rank {args.rank}"), encoding="utf-8")
        console.print(Text(f"wrote {args.svg}", style="dim", overflow="fold"), soft_wrap=False)
    if verdict.failure:
        console.print(f"[red]the claim failed:[/]\n{verdict.failure}", markup=True, highlight=False)
        return DRIFT
    return CLEAN
