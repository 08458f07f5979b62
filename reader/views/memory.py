"""A memory series drawn: the bytes each rank holds per category over one step, as terminal bars and as SVG.

A series is ``{label: [(moment, {category: bytes}), ...]}`` (`checks.probes.memory_series`). Both pictures carry
their numbers: each moment's total in bytes, each series' peak and where it is, a scale (the terminal says what
one cell is worth; the SVG draws an axis with ticks), and every SVG bar its exact bytes (``data-bytes``), so the
picture's numbers are the probe's numbers. Without colour each category keeps a glyph of its own.
"""

from __future__ import annotations

from html import escape
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.text import Text

CATEGORIES = ("params", "unsharded", "grads", "optim")  # drawn left to right; buffers are 0 in these models
STYLES = {"params": "blue", "unsharded": "magenta", "grads": "yellow", "optim": "green"}
GLYPHS = {"params": "█", "unsharded": "▓", "grads": "▒", "optim": "░"}  # told apart without colour too
COLOURS = {"params": "#4c72b0", "unsharded": "#c44e9c", "grads": "#dd8452", "optim": "#55a868"}
Series = dict[str, list[tuple[str, dict[str, int]]]]


def _total(categories: dict[str, int]) -> int:
    return sum(int(categories.get(k, 0)) for k in CATEGORIES)


def _largest(series: Series) -> int:
    return max((_total(c) for points in series.values() for _, c in points), default=0)


def _bytes(n: int) -> str:
    return f"{n:,} B"


def picture(series: Series, title: str) -> RenderableType:
    """Per series: a line per moment with its total bytes and a stacked bar, then the series' peak."""
    legend = Text.assemble(*((f"{GLYPHS[k]} {k}  ", STYLES[k]) for k in CATEGORIES))
    legend.append("bytes held, from distinct storages", style="dim")
    return Group(Text(title, style="bold"), legend, MemoryBars(series))


class MemoryBars:
    """The bars, laid out at the width they are drawn at: moment, total, bar (scaled to the largest total)."""

    def __init__(self, series: Series) -> None:
        self.series = series

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        largest = max(_largest(self.series), 1)
        moment_width = max((len(m) for points in self.series.values() for m, _ in points), default=6)
        total_width = len(_bytes(largest))
        cells = max(10, options.max_width - moment_width - total_width - 4)
        for label, points in self.series.items():
            yield Text(label, style="bold")
            for moment, categories in points:
                bar = Text()
                for k in CATEGORIES:
                    bar.append(GLYPHS[k] * round(cells * int(categories.get(k, 0)) / largest), style=STYLES[k])
                line = Text(f"{moment:<{moment_width}}  {_bytes(_total(categories)):>{total_width}}  ")
                line.append_text(bar)
                line.no_wrap, line.overflow = True, "crop"
                yield line
            peak_moment, peak = max(((m, _total(c)) for m, c in points), key=lambda p: p[1], default=("", 0))
            yield Text(f"peak {_bytes(peak)} at {peak_moment}", style="dim")
        yield Text(f"scale: the longest bar is {_bytes(largest)}; one cell is {largest / cells:,.0f} B", style="dim")


def extras(value: dict[str, Any]) -> list[Text]:
    """The other values a memory check returns, as readable lines (``all_gathers: FULL_SHARD 7 · ...``)."""
    lines = []
    for key, item in value.items():
        if key == "series":
            continue
        parts = item.items() if isinstance(item, dict) else None
        shown = " · ".join(f"{k} {_number(v)}" for k, v in parts) if parts is not None else _number(item)
        lines.append(Text.assemble((f"{key}: ", "bold"), shown))
    return lines


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


TICKS = 4  # the axis is cut in quarters of the largest total


def svg(series: Series, title: str) -> str:
    """A self-contained SVG on a white ground: per series, a row of stacked bars per moment, each row's total at
    its end, each series' peak, an axis with ticks in bytes, a legend; each rect says its bytes."""
    row, label_w, bar_w, gap, value_w = 18, 170, 420, 26, 110
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
                    f'data-bytes="{nbytes}"><title>{escape(moment)}: {k} {nbytes:,} bytes</title></rect>'
                )
                x += width
            total = _total(categories)
            body.append(
                f'<text x="{x + 4:.1f}" y="{y + 12}" font-size="11" data-total="{total}">{_bytes(total)}</text>'
            )
            y += row
        peak_moment, peak = max(((m, _total(c)) for m, c in points), key=lambda p: p[1], default=("", 0))
        body.append(
            f'<text x="{label_w}" y="{y + 12}" font-size="11" fill="#555" data-peak="{peak}">'
            f"peak {_bytes(peak)} at {escape(peak_moment)}</text>"
        )
        y += row + gap // 2
    y = _axis(body, y, label_w, bar_w, largest)
    legend_x = label_w
    for k in CATEGORIES:
        body.append(f'<rect x="{legend_x}" y="{y}" width="12" height="12" fill="{COLOURS[k]}"/>')
        body.append(f'<text x="{legend_x + 16}" y="{y + 11}">{k}</text>')
        legend_x += 100
    height = y + 30
    width = label_w + bar_w + value_w
    ground = f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>'  # opaque when turned into PNG
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'font-family="sans-serif" '
        f'font-size="12">\n{ground}\n' + "\n".join(body) + "\n</svg>\n"
    )


def _axis(body: list[str], y: int, left: int, width: int, largest: int) -> int:
    """A horizontal axis under the bars, ticked at each quarter of ``largest``; the y below it."""
    body.append(f'<line x1="{left}" y1="{y}" x2="{left + width}" y2="{y}" stroke="#333"/>')
    for i in range(TICKS + 1):
        x = left + width * i / TICKS
        value = round(largest * i / TICKS)
        body.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#333"/>')
        body.append(
            f'<text x="{x:.1f}" y="{y + 16}" font-size="10" text-anchor="middle" data-tick="{value}">{value:,}</text>'
        )
    body.append(f'<text x="{left + width / 2:.1f}" y="{y + 30}" font-size="11" text-anchor="middle">bytes</text>')
    return y + 44
