"""A memory series drawn: the bytes each rank holds per category over one step, as terminal bars and as SVG.

A series is ``{label: [(moment, {category: bytes}), ...]}`` (`checks.probes.memory_series`). The terminal picture
gives each moment's total; the SVG's every bar carries its exact bytes (``data-bytes``), so the picture's numbers
are the probe's numbers.
"""

from __future__ import annotations

from html import escape
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

CATEGORIES = ("params", "unsharded", "grads", "optim")  # drawn left to right; buffers are 0 in these models
STYLES = {"params": "blue", "unsharded": "magenta", "grads": "yellow", "optim": "green"}
COLOURS = {"params": "#4c72b0", "unsharded": "#c44e9c", "grads": "#dd8452", "optim": "#55a868"}
BAR = 28  # terminal bar width in cells
Series = dict[str, list[tuple[str, dict[str, int]]]]


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
