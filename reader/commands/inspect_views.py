"""``inspect --view``: the study commands' pictures drawn from an ``inspect`` run instead of a claim's: guide 12's
layout diagram per unit, the memory bars over the measured step (the second; under DDP the third), and the
timeline of that step's events and collectives (the run captures its probe logs when the timeline is asked
for)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.text import Text

MAX_WIDTH = 100


def draw(console: Console, views: Sequence[str], measured: dict[str, Any], captured: list[Any], *, model: str,
         rank: int) -> None:  # fmt: skip
    """Each view asked for, of ``rank``'s run."""
    title = f"{model} · rank {rank}"
    for view in views:
        if view == "layout":
            _layout(console, measured, title)
        elif view == "memory":
            _memory(console, measured, title)
        else:
            _timeline(console, captured, title, rank)


def _layout(console: Console, measured: dict[str, Any], title: str) -> None:
    from checks.models.flat_param_diagram import diagram_lines
    from reader.study.layout import PADDING

    console.print(Text(f"{title} · flat parameters", style="bold"))
    if not measured["diagrams"]:  # guide 12's diagram reads FSDP1's FlatParameter; FSDP2 and DDP have none
        console.print(Text("no flat parameter to draw: only FSDP1 (full-shard, shard-grad-op, no-shard) builds one"))
    for fields in measured["diagrams"].values():
        for line in diagram_lines(fields, width=max(40, min(console.width, MAX_WIDTH))):
            text = Text(line, no_wrap=True, overflow="ignore")
            text.highlight_regex(PADDING, "yellow")
            console.print(text, soft_wrap=False)


def _memory(console: Console, measured: dict[str, Any], title: str) -> None:
    from reader.views.memory import picture

    console.print(picture(measured["series"], f"{title} · memory"), soft_wrap=False)


def _timeline(console: Console, captured: list[Any], title: str, rank: int) -> None:
    from reader.views.lanes import rows
    from reader.views.timeline import rank_view

    console.print(Text(f"{title} · timeline", style="bold"))
    console.print(rank_view(rank, rows(captured), captured), soft_wrap=False)
