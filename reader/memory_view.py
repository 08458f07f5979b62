"""``fsdp-readings memory GUIDE CLAIM``: the bytes each rank holds per category over one step, drawn from a real
run of a claim whose check records a memory series (`checks.probes.memory_series`).

The check returns ``{"series": {label: [(moment, {category: bytes}), ...]}, ...}``; this view draws each label's
series as rows of stacked bars in the terminal and, with ``--svg FILE``, as an SVG whose every bar carries its
exact bytes (``data-bytes``), so the picture's numbers are the probe's numbers.
"""

from __future__ import annotations

import argparse
from html import escape
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from reader.cli_session import CLEAN, DRIFT
from reader.study import pool_options, run_for_rank

CATEGORIES = ("params", "unsharded", "grads", "optim")  # drawn left to right; buffers are 0 in these models
STYLES = {"params": "blue", "unsharded": "magenta", "grads": "yellow", "optim": "green"}
COLOURS = {"params": "#4c72b0", "unsharded": "#c44e9c", "grads": "#dd8452", "optim": "#55a868"}
BAR = 28  # terminal bar width in cells

EXAMPLES = """examples:
  fsdp-readings memory 03-unshard-reshard memory-over-the-step
  fsdp-readings memory 03-unshard-reshard memory-over-the-step --svg memory.svg --rank 1

the claim's check must record a memory series; the SVG's bars carry their exact bytes"""

Series = dict[str, list[tuple[str, dict[str, int]]]]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXAMPLES
    parser.add_argument("guide", metavar="GUIDE", help="a guide id, e.g. 03-unshard-reshard")
    parser.add_argument("claim", metavar="CLAIM", help="a claim whose check records a memory series")
    parser.add_argument("--rank", type=int, default=0, help="whose memory to draw (default: rank 0)")
    parser.add_argument("--svg", type=Path, default=None, metavar="FILE", help="also write the picture as SVG")
    pool_options(parser)


def run(args: argparse.Namespace, console: Console) -> int:
    reading = run_for_rank(args, console)
    if isinstance(reading, int):
        return reading
    guide, verdict, value = reading.guide, reading.verdict, reading.value
    series: Series | None = value.get("series") if isinstance(value, dict) else None
    if not series:
        console.print(f"[red]{args.claim} records no memory series[/] (its check returns no `series`)")
        return DRIFT
    console.print(picture(series, f"{guide.id} · {args.claim} · rank {args.rank}"), soft_wrap=False)
    for key, item in value.items():
        if key != "series":
            console.print(Text(f"{key}: {item}", overflow="fold"), soft_wrap=False)
    if args.svg is not None:
        args.svg.write_text(svg(series, f"{guide.id} · {args.claim} · rank {args.rank}"), encoding="utf-8")
        console.print(Text(f"wrote {args.svg}", style="dim", overflow="fold"), soft_wrap=False)
    if verdict.failure:
        console.print(f"[red]the claim failed:[/]\n{verdict.failure}", markup=True, highlight=False)
        return DRIFT
    return CLEAN


def _largest(series: Series) -> int:
    return max((sum(c.get(k, 0) for k in CATEGORIES) for points in series.values() for _, c in points), default=1)


def picture(series: Series, title: str) -> Group:
    """One table per series: each moment's bytes by category and a stacked bar scaled to the largest total."""
    largest = max(_largest(series), 1)
    legend = Text.assemble(
        *((f"█ {k}  ", STYLES[k]) for k in CATEGORIES), ("bytes held, from distinct storages", "dim")
    )
    parts: list[Any] = [Text(title, style="bold"), legend]
    for label, points in series.items():
        table = Table(title=label, title_justify="left", expand=True, pad_edge=False)
        table.add_column("moment", overflow="fold", min_width=18)
        table.add_column("KiB", justify="right", no_wrap=True)
        table.add_column("", no_wrap=True, width=BAR, ratio=1)
        for moment, categories in points:
            total = sum(categories.get(k, 0) for k in CATEGORIES)
            bar = Text()
            for k in CATEGORIES:
                bar.append("█" * round(BAR * categories.get(k, 0) / largest), style=STYLES[k])
            table.add_row(moment, f"{total / 1024:.1f}", bar)
        parts.append(table)
    return Group(*parts)


def svg(series: Series, title: str) -> str:
    """A self-contained SVG: per series, one row of stacked bars per moment; each rect says its bytes."""
    row, label_w, bar_w, gap = 18, 170, 420, 26
    largest = max(_largest(series), 1)
    y = 40
    body = [f'<text x="8" y="22" font-weight="bold">{escape(title)}</text>']
    for label, points in series.items():
        body.append(f'<text x="8" y="{y + 12}" font-weight="bold">{escape(label)}</text>')
        y += gap
        for moment, categories in points:
            body.append(f'<text x="8" y="{y + 12}">{escape(moment)}</text>')
            x = float(label_w)
            for k in CATEGORIES:
                nbytes = int(categories.get(k, 0))
                width = bar_w * nbytes / largest
                body.append(
                    f'<rect x="{x:.1f}" y="{y}" width="{width:.1f}" height="{row - 4}" fill="{COLOURS[k]}" '
                    f'data-series="{escape(label)}" data-moment="{escape(moment)}" data-category="{k}" '
                    f'data-bytes="{nbytes}"><title>{escape(moment)}: {k} {nbytes} bytes</title></rect>'
                )
                x += width
            y += row
        y += gap // 2
    legend_x = label_w
    for k in CATEGORIES:
        body.append(f'<rect x="{legend_x}" y="{y}" width="12" height="12" fill="{COLOURS[k]}"/>')
        body.append(f'<text x="{legend_x + 16}" y="{y + 11}">{k}</text>')
        legend_x += 100
    height = y + 30
    width = label_w + bar_w + 20
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        f'font-size="12">\n' + "\n".join(body) + "\n</svg>\n"
    )
