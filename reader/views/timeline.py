"""How ``fsdp-readings timeline`` draws: a header that says what the order of the rows means on this backend, and
one table per rank (number, lane, what happened, the torch line, the quoted anchor that line is in).

Rows stay one line each where they can: where a row's anchor name does not fit beside its source at the width
drawn, it moves under the source on a line of its own instead of being folded letter by letter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from reader.views.lanes import LANES, Row, lane_cell, logs_of

FSDP_DIR = "torch/distributed/fsdp/"
_GAPS = 4  # one space after each of the first four columns
_ANCHOR_ROOM = 10  # narrower than this, no anchor column: every anchor goes under its source


def header(
    guide_id: str, claim: str, *, world_size: int, ranks: Sequence[int], iteration: int | None, backend: str, torch: str
) -> RenderableType:
    """What is drawn, on which backend, and what the order of the rows means there."""
    who = "every rank" if len(ranks) > 1 else f"rank {ranks[0]}"
    which = f"iteration {iteration}" if iteration is not None else "every iteration"
    if backend == "nccl":
        streams = (
            "Rows are in issue order per rank. On GPU, FSDP issues its all-gathers on its unshard stream and "
            "computes on the default stream: a row says when work was issued, not when it ran, and the streams "
            "may overlap. Read it as issue order per stream."
        )
    else:
        streams = (
            "Rows are in issue order. On CPU streams do not overlap (FSDP's CUDA stream waits are no-ops), "
            "so this view shows the order work was issued, not concurrency."
        )
    items = [f"{letter} {meaning}" for letter, meaning in LANES]
    legend = f"{' · '.join(items[:3])}\n       {' · '.join(items[3:])}"  # two lines: no item split at 80
    device = " (CPU)" if backend == "gloo" else ""
    body = Group(
        Text(f"{who} of {world_size} · {which} · {backend}{device} · torch {torch}"),
        Text(streams),
        Text(f"lanes: {legend}", style="dim"),
        Text(
            f"source: the torch line that issued the row (paths under {FSDP_DIR} unless shown; a › b: a "
            "prefetch issued at a, its unshard at line b). ★: the line is inside the quoted anchor named.",
            style="dim",
        ),
    )
    return Panel(body, title=Text(f"timeline · {guide_id} · {claim}", style="bold"), title_align="left")


def rank_view(rank: int, drawn: Sequence[Row], captured: Sequence[Any]) -> RenderableType:
    """One rank's notes (what it recorded) and its rows."""
    event_logs, comm_logs = logs_of(captured)
    notes = [f"rank {rank}: {len(event_logs)} event recording(s), {len(comm_logs)} collective recording(s)"]
    if not comm_logs:
        notes.append("no record_comm block in this check: collectives show only through unshard and reduce rows")
    notes += [str(item) for item in captured if isinstance(item, str)]  # a log that could not be sent back
    notes += [note for log in event_logs for note in getattr(log, "notes", [])]
    return Group(Text("\n".join(notes), style="dim"), RankTable(list(drawn), recordings=len(event_logs)))


@dataclass(frozen=True)
class RankTable:
    """The rows of one rank, laid out at the width they are drawn at."""

    rows: list[Row]
    recordings: int = 1

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        numbers = iter(range(1, len(self.rows) + 1))
        cells = [self._cells(row, 0 if row.marker else next(numbers)) for row in self.rows]
        heads = ("#", "".join(letter for letter, _ in LANES), "event", "source")
        widths = [max([len(heads[i]), *(c[i].cell_len for c in cells)]) for i in range(4)]
        # A source location is one token (``_fully_shard/_fsdp_state.py:311``): it is never folded. Where it does
        # not fit beside the events, it goes under each event, as the anchor does where there is no room for it.
        source_beside = sum(widths) + _GAPS - 1 <= options.max_width
        room = options.max_width - sum(widths) - _GAPS  # what is left for the anchor column
        beside = source_beside and room >= _ANCHOR_ROOM
        table = Table(box=None, pad_edge=False, padding=(0, 1, 0, 0), show_edge=False, header_style="bold")
        table.add_column(heads[0], justify="right", no_wrap=True)
        table.add_column(heads[1], no_wrap=True)
        table.add_column(heads[2])  # events wrap at their words
        if source_beside:
            table.add_column(heads[3], no_wrap=True)
        if beside:
            table.add_column("anchor", no_wrap=True)
        for number, lane, event, source, anchor in cells:
            fits = beside and anchor.cell_len <= room
            extra = [source] if source_beside else []
            table.add_row(number, lane, event, *extra, *([anchor if fits else ""] if beside else []))
            under = [line for line in ([] if source_beside else [source]) + [anchor] if line.plain]
            if fits:
                under = [line for line in under if line is not anchor]
            for line in under:  # under the event, on a line of its own
                padding = [""] * (len(extra) + int(beside))
                table.add_row("", "", Text.assemble("  ", line), *padding)
        if not self.rows:
            table.add_row("", "", Text("nothing recorded here", style="dim"), *([""] * int(source_beside)))
        yield table

    def _cells(self, row: Row, number: int) -> tuple[Text, Text, Text, Text, Text]:
        """(number, lane, event, source, anchor) of one row."""
        if row.marker:
            recording = f" · recording {row.recording}" if self.recordings > 1 else ""
            title = Text(f"{row.phase} · iteration {row.iteration}{recording}", style="bold cyan")
            return Text(""), Text("━" * len(LANES), style="cyan"), title, Text(""), Text("")
        mark = Text(f"★ {row.anchor}", style="bold yellow") if row.anchor else Text("")
        event = Text(row.text, style="dim" if row.lane == "F" else "")
        return Text(str(number)), Text(lane_cell(row.lane)), event, where(row), mark


def where(row: Row) -> Text:
    """``_runtime_utils.py:434 › 1233``: the source line, and a prefetch's unshard line (same file: its number)."""
    if not row.source:
        return Text("(not attributed)", style="dim")
    shown = _short(row.source)
    if row.via:
        via_path, _, via_line = row.via.rpartition(":")
        same = via_path == row.source.rpartition(":")[0]
        shown += f" › {via_line if same else _short(row.via)}"
    return Text(shown)


def _short(location: str) -> str:
    return location.removeprefix(FSDP_DIR)
