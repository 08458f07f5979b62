"""Rich renderables for what the probes recorded: small pieces that compose, and plain text for failure messages.

- `event_table`: one rank's FSDP events; `rank_sequences`: the same sequence on every rank, side by side.
- `side_by_side`: expected vs observed, the first divergence marked (``▶``), for assertion messages.
- `comm_table`: per op kind, count, elements, logical bytes, ring bytes per rank and their share, and the ratio to
  a reference (|θ|·4 bytes for "communication per step in units of the fp32 model").
- `memory_table`: bytes per category for several snapshots (e.g. DDP vs FSDP), with fractions of the first.
- `to_text`: any of them as plain text, no colour, fixed width.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table

from checks.probes.comm import CommLog
from checks.probes.event_log import EventLog
from checks.probes.memory import CATEGORIES, MemorySnapshot

MARK = "▶"


def to_text(renderable: RenderableType, width: int = 120) -> str:
    console = Console(width=width, record=True, color_system=None, force_terminal=False, file=_Sink())
    console.print(renderable)
    return console.export_text(styles=False).rstrip() + "\n"


class _Sink:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


# -- events --------------------------------------------------------------------------------------------------------
def event_table(
    log: EventLog, *, kinds: str | tuple[str, ...] | None = None, iteration: int | None = None, title: str = ""
) -> Table:
    table = Table(title=title or f"FSDP events, rank {log.rank}", box=box.SIMPLE_HEAD, title_justify="left")
    for column in ("#", "iter", "event", "unit", "state", "target", "detail"):
        table.add_column(column, justify="right" if column in ("#", "iter") else "left")
    for event in log.select(kinds, iteration=iteration):
        table.add_row(
            str(event.index),
            str(event.iteration),
            event.kind,
            event.unit,
            event.state,
            event.target or "",
            event.detail,
        )
    return table


def rank_sequences(
    logs: Sequence[EventLog], *, kinds: str | tuple[str, ...] | None = None, iteration: int | None = None
) -> Table:
    """One column per rank; rows where a rank differs from rank 0 are marked."""
    sequences = [log.sequence(kinds, iteration=iteration) for log in logs]
    table = Table(title="FSDP event sequence per rank", box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("", width=1)
    table.add_column("#", justify="right")
    for log in logs:
        table.add_column(f"rank {log.rank}")
    for row in range(max((len(s) for s in sequences), default=0)):
        cells = [s[row] if row < len(s) else "" for s in sequences]
        differs = any(c != cells[0] for c in cells)
        table.add_row(MARK if differs else "", str(row + 1), *cells, style="bold red" if differs else None)
    return table


def first_divergence(expected: Sequence[object], observed: Sequence[object]) -> int | None:
    """Index of the first position where the sequences differ (including one ending early), or None."""
    for i, (e, o) in enumerate(zip(expected, observed, strict=False)):
        if e != o:
            return i
    return None if len(expected) == len(observed) else min(len(expected), len(observed))


def side_by_side(
    expected: Sequence[object],
    observed: Sequence[object],
    *,
    title: str = "",
    labels: tuple[str, str] = ("expected", "observed"),
) -> Table:
    """Expected and observed sequences in two columns, the first divergence marked with ``▶`` and rows after it
    dimmed (they follow from the divergence)."""
    at = first_divergence(expected, observed)
    caption = "identical" if at is None else f"first divergence at #{at + 1}"
    table = Table(title=title or None, caption=caption, box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("", width=1)
    table.add_column("#", justify="right")
    table.add_column(labels[0])
    table.add_column(labels[1])
    for row in range(max(len(expected), len(observed))):
        e = str(expected[row]) if row < len(expected) else "—"
        o = str(observed[row]) if row < len(observed) else "—"
        style = "bold red" if row == at else ("dim" if at is not None and row > at else None)
        table.add_row(MARK if row == at else "", str(row + 1), e, o, style=style)
    return table


# -- communication -------------------------------------------------------------------------------------------------
def comm_table(
    log: CommLog,
    *,
    reference_bytes: int | None = None,
    reference: str = "|θ|·4",
    title: str = "",
    objects: bool | None = False,
) -> Table:
    """Per op kind: count, elements, logical bytes, ring bytes per rank, share of the ring bytes, and ring bytes
    over ``reference_bytes`` (e.g. |θ|·4 for an fp32 model) when given."""
    totals = log.totals(objects=objects)
    all_ring = sum(t.ring_bytes for t in totals)
    table = Table(
        title=title or f"collectives, rank {log.rank} of {log.world_size}",
        box=box.SIMPLE_HEAD,
        title_justify="left",
        show_footer=True,
    )
    table.add_column("op", footer="total")
    table.add_column("count", justify="right", footer=str(sum(t.count for t in totals)))
    table.add_column("elements", justify="right", footer=str(sum(t.numel for t in totals)))
    table.add_column("bytes S", justify="right", footer=str(sum(t.nbytes for t in totals)))
    table.add_column("ring bytes/rank", justify="right", footer=_num(all_ring))
    table.add_column("share", justify="right", footer="100%" if all_ring else "")
    if reference_bytes:
        table.add_column(f"/ {reference}", justify="right", footer=_ratio(all_ring, reference_bytes))
    for t in totals:
        row = [
            t.op,
            str(t.count),
            str(t.numel),
            str(t.nbytes),
            _num(t.ring_bytes),
            f"{100 * t.ring_bytes / all_ring:.0f}%" if all_ring else "",
        ]
        if reference_bytes:
            row.append(_ratio(t.ring_bytes, reference_bytes))
        table.add_row(*row)
    return table


def comm_records(log: CommLog, *, title: str = "") -> Table:
    """Every recorded collective, in order."""
    table = Table(title=title or f"collectives in order, rank {log.rank}", box=box.SIMPLE_HEAD, title_justify="left")
    for column in ("#", "op", "elements", "dtype", "ring bytes", "group", "api", "caller"):
        table.add_column(column, justify="right" if column in ("#", "elements", "ring bytes") else "left")
    for r in log:
        api = r.api + (" (object)" if r.object_collective else "") + (" async" if r.async_op else "")
        group = f"{r.group_size}: {list(r.group_ranks)}" if r.group_ranks else str(r.group_size)
        table.add_row(
            str(r.index), r.op, str(r.numel), r.dtype.removeprefix("torch."), _num(r.ring_bytes), group, api, r.caller
        )
    return table


# -- memory --------------------------------------------------------------------------------------------------------
def memory_table(snapshots: dict[str, MemorySnapshot], *, title: str = "memory per rank (bytes)") -> Table:
    """Bytes per category, one column per snapshot, and each later column's fraction of the first."""
    names = list(snapshots)
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("category")
    for name in names:
        table.add_column(name, justify="right")
    for name in names[1:]:
        table.add_column(f"{name} / {names[0]}", justify="right")
    for category in (*CATEGORIES, "total"):
        values = [s.total if category == "total" else s.nbytes(category) for s in snapshots.values()]
        fractions = [_fraction(v, values[0]) for v in values[1:]]
        table.add_row(category, *(str(v) for v in values), *fractions)
    return table


def stack(*renderables: RenderableType) -> Group:
    """Compose renderables vertically (e.g. a comm table under an event table)."""
    return Group(*renderables)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def _ratio(value: float, reference: int) -> str:
    return f"{value / reference:.3f}" if reference else ""


def _fraction(value: int, reference: int) -> str:
    if not reference:
        return ""
    f = Fraction(value, reference)
    return f"{f.numerator}/{f.denominator} = {float(f):.3f}" if f.denominator != 1 else str(f.numerator)
