"""``fsdp-readings layout GUIDE CLAIM``: one real flat parameter across ranks, drawn from a run of a claim.

The claim's check reads the fields a ``FlatParameter`` carries inside its ranks and returns them under ``layout``
(`checks.models.flat_param_diagram.layout_fields`); this view draws them with the same torch-free renderer the
guide's diagram is checked against (`diagram_lines`), so what the terminal shows is what the ranks built.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.text import Text

from reader.study.runner import pool_options, run_for_rank
from reader.study.session import CLEAN, DRIFT
from reader.views.problem import guarded

EXAMPLES = """examples:
  fsdp-readings layout 12-flat-parameter layout-at-4
  fsdp-readings layout 12-flat-parameter layout-at-4 --rank 3

the claim's check must return the layout it read under `layout`"""

PADDING = r"[.~_]{2,}"  # runs of the renderer's padding fills: alignment, world-size padding, shard padding
MAX_WIDTH = 100


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXAMPLES
    parser.add_argument("guide", metavar="GUIDE", help="a guide id, e.g. 12-flat-parameter")
    parser.add_argument("claim", metavar="CLAIM", help="a claim whose check returns a flat parameter's layout")
    parser.add_argument("--rank", type=int, default=0, help="whose reading to draw (default: rank 0)")
    pool_options(parser)


@guarded
def run(args: argparse.Namespace, console: Console) -> int:
    from checks.models.flat_param_diagram import diagram_lines

    reading = run_for_rank(args, console, "layout")
    if reading is None:
        return CLEAN
    guide, verdict, value = reading.guide, reading.verdict, reading.value
    fields = value.get("layout") if isinstance(value, dict) else None
    if not fields:
        console.print(f"[red]{args.claim} returns no layout[/] (its check returns no `layout`)")
        return DRIFT
    console.print(Text(f"{guide.id} · {args.claim} · as rank {args.rank} read it", style="bold"))
    for line in diagram_lines(fields, width=min(console.width, MAX_WIDTH)):
        text = Text(line, no_wrap=True, overflow="ignore")
        text.highlight_regex(PADDING, "yellow")
        console.print(text, soft_wrap=False)
    if verdict.failure:
        console.print(f"[red]the claim failed:[/]\n{verdict.failure}", markup=True, highlight=False)
        return DRIFT
    return CLEAN
