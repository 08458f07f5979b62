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
_GAPS = 5  # one space after each of the first five columns
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
    if event_logs:
        notes.append("held: the units whose parameters are unsharded after the row, and their bytes, where it changes")
    recordings = len(event_logs) or len(comm_logs)
    table = RankTable(list(drawn), recordings=recordings, held=bool(event_logs))
    return Group(Text("\n".join(notes), style="dim"), table)


@dataclass(frozen=True)
class RankTable:
    """The rows of one rank, laid out at the width they are drawn at."""

    rows: list[Row]
    recordings: int = 1
    held: bool = True  # a held column: only FSDP events say what is unsharded

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        numbers = iter(range(1, len(self.rows) + 1))
        cells = [self._cells(row, 0 if row.marker else next(numbers), before) for row, before in self._pairs()]
        heads = ("#", "".join(letter for letter, _ in LANES), "event", "held", "source")
        plain = [c for c, row in zip(cells, self.rows, strict=True) if not row.marker]  # titles span the row
        widths = [max([len(heads[i]), *(c[i].cell_len for c in plain)]) for i in range(5)]
        # A source location is one token (``_fully_shard/_fsdp_state.py:311``): it is never folded. Where it does
        # not fit beside the events, it goes under each event, as the anchor does where there is no room for it.
        source_beside = sum(widths) + _GAPS <= options.max_width
        room = options.max_width - sum(widths) - _GAPS - 1  # what is left for the anchor column
        beside = source_beside and room >= _ANCHOR_ROOM
        # Narrow: the held units go under the event too, so that the event column can hold a source location.
        others = widths[0] + widths[1] + (widths[3] + widths[4] if source_beside else 0) + _GAPS
        # The lines under an event (source, held, anchor) are single tokens: the column is as wide as the widest.
        under = 0 if source_beside else 2 + max([widths[4], 6 + widths[3], *(c[5].cell_len for c in plain)])
        event_width = max(10, min(max(widths[2], under), options.max_width - others))  # events wrap at words
        layout = _Layout(heads, widths, event_width, source_beside, room if beside else 0)
        table = layout.table(header=True)
        for (number, lane, event, held, source, anchor), row in zip(cells, self.rows, strict=True):
            if row.marker:  # a phase, iteration or recording begins: its title on a line of its own, whole
                if table.row_count or table.show_header:  # the header comes first, before any title
                    yield table
                    table = layout.table(header=False)
                yield Text.assemble(" " * (widths[0] + 1), lane, " ", event)
                continue
            fits = beside and anchor.cell_len <= room
            extra = [held, source] if source_beside else []
            table.add_row(number, lane, event, *extra, *([anchor if fits else ""] if beside else []))
            moved = [] if source_beside else [Text.assemble("held: ", held) if held.plain else held, source]
            under = [line for line in [*moved, anchor] if line.plain]
            if fits:
                under = [line for line in under if line is not anchor]
            for line in under:  # under the event, on a line of its own
                padding = [""] * (len(extra) + int(beside))
                table.add_row("", "", Text.assemble("  ", line), *padding)
        if not self.rows:
            table.add_row("", "", Text("nothing recorded here", style="dim"), *([""] * (2 * int(source_beside))))
        if table.row_count or table.show_header:
            yield table

    def _pairs(self) -> list[tuple[Row, Row | None]]:
        """Each row with the row before it that is not a marker (whose held units it may change)."""
        pairs, before = [], None
        for row in self.rows:
            pairs.append((row, before))
            if not row.marker:
                before = row
        return pairs

    def _cells(self, row: Row, number: int, before: Row | None) -> tuple[Text, Text, Text, Text, Text, Text]:
        """(number, lane, event, held, source, anchor) of one row; ``held`` only where it changes."""
        if row.marker:
            recording = f" · recording {row.recording}" if self.recordings > 1 else ""
            label = f": {row.label}" if row.label else ""
            title = Text(f"{row.phase} · iteration {row.iteration}{recording}{label}", style="bold cyan")
            return Text(""), Text("━" * len(LANES), style="cyan"), title, Text(""), Text(""), Text("")
        mark = Text(f"★ {row.anchor}", style="bold yellow") if row.anchor else Text("")
        event = Text(row.text, style="dim" if row.lane == "F" else "")
        first = before is None or before.recording != row.recording
        changed = self.held and (first or (before.held, before.held_bytes) != (row.held, row.held_bytes))
        changed = changed and not (first and not row.held)  # nothing seen yet is not "none held"
        return (
            Text(str(number)),
            Text(lane_cell(row.lane)),
            event,
            held_text(row) if changed else Text(""),
            where(row),
            mark,
        )


@dataclass(frozen=True)
class _Layout:
    """The columns every segment of a rank's table shares, so that segments split at titles stay aligned."""

    heads: tuple[str, ...]
    widths: list[int]
    event_width: int
    source_beside: bool
    anchor_width: int  # 0: no anchor column

    def table(self, *, header: bool) -> Table:
        table = Table(
            box=None, pad_edge=False, padding=(0, 1, 0, 0), show_edge=False, header_style="bold", show_header=header
        )
        table.add_column(self.heads[0], justify="right", no_wrap=True, width=self.widths[0])
        table.add_column(self.heads[1], no_wrap=True, width=self.widths[1])
        table.add_column(self.heads[2], width=self.event_width)  # events wrap at their words
        if self.source_beside:
            table.add_column(self.heads[3], no_wrap=True, width=self.widths[3])
            table.add_column(self.heads[4], no_wrap=True, width=self.widths[4])
        if self.anchor_width:
            table.add_column("anchor", no_wrap=True)
        return table


def held_text(row: Row) -> Text:
    """``root+1+2 78,192 B``: the units unsharded after this row (``blocks.`` left out) and their bytes."""
    if not row.held:
        return Text("none", style="dim")
    units = "+".join(unit.removeprefix("blocks.") for unit in row.held)
    return Text(units + (f" {row.held_bytes:,} B" if row.held_bytes is not None else ""), style="magenta")


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
