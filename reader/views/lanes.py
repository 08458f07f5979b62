"""The rows of ``fsdp-readings timeline``: a captured check's probe logs merged into one issue-ordered list per
rank, each row in its lane and, when its torch line lies inside one of the guide's quoted anchors, marked with it.

Torch-free and duck-typed on purpose: the logs are `checks.probes` records (an ``EventLog`` has ``events``, a
``CommLog`` has ``records``), but importing them would import torch into every ``fsdp-readings`` command.

Order is ``seq``, the clock every recorder of a rank shares (`checks.probes.clock`): it says which collective was
issued inside which hook, never when anything ran.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

LANES: tuple[tuple[str, str], ...] = (
    ("F", "phase and hooks"),
    ("U", "unshard, all-gather"),
    ("P", "prefetch -> target"),
    ("R", "reshard, free"),
    ("C", "reduce-scatter, all-reduce, other collectives"),
)
_EVENT_LANES = {
    "root_pre_forward": "F", "pre_backward": "F", "post_backward": "F", "final_callback": "F",
    "unshard": "U", "wait_unshard": "U", "prefetch": "P", "free": "R", "reshard": "R", "reduce_grad": "C",
}  # fmt: skip
_BACKWARD_KINDS = frozenset({"pre_backward", "post_backward", "reduce_grad"})
_DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float64": "fp64"}


@dataclass(frozen=True)
class Span:
    """A quoted anchor's lines in the installed torch (`reader.source.anchors.Resolution`: relpath, start, end)."""

    name: str
    relpath: str
    start: int
    end: int

    def contains(self, location: str) -> bool:
        path, _, line = location.rpartition(":")
        return path == self.relpath and line.isdigit() and self.start <= int(line) <= self.end


@dataclass(frozen=True)
class Row:
    """One line of the timeline. ``marker`` rows have no record behind them: they open a compute phase."""

    seq: int
    iteration: int
    phase: str  # "forward" | "backward" | "" (before any FSDP event, or between a final callback and a forward)
    lane: str  # a letter of `LANES`
    text: str
    source: str = ""  # torch file:line that issued it (captured runs only)
    via: str = ""  # a prefetch's line inside the prefetch function
    anchor: str | None = None  # the narrowest quoted anchor holding ``source`` or ``via``
    recording: int = 1  # which record_events block (iterations restart in each)
    marker: bool = False


def event_text(event: Any) -> str:
    """What an FSDP event did, short enough for one row."""
    unit = event.unit
    match event.kind:
        case "root_pre_forward":
            return f"{unit} pre-forward (root)"
        case "unshard":
            return f"unshard {unit}" + (" (no all-gather)" if event.detail == "no all-gather" else "")
        case "wait_unshard":
            return f"wait for unshard {unit}"
        case "prefetch":
            return f"prefetch {unit} -> {event.target}"
        case "free":
            return f"free {unit}"
        case "reshard":
            return f"reshard {unit} (kept)"
        case "pre_backward":
            return f"pre-backward {unit}"
        case "post_backward":
            return f"post-backward {unit}" + (f" ({event.detail})" if event.detail else "")
        case "reduce_grad":
            return f"{event.detail or 'reduce'} {unit}"
        case "final_callback":
            return "final callback"
    return f"{event.kind} {unit}"


def collective_text(record: Any) -> str:
    dtype = _DTYPES.get(record.dtype, record.dtype.removeprefix("torch."))
    return f"{record.op} {record.numel:,} {dtype}".rstrip()


def logs_of(captured: Iterable[Any]) -> tuple[list[Any], list[Any]]:
    """(event logs, comm logs) among a rank's captured items (anything else: an unpicklable log's note)."""
    items = list(captured)
    return [x for x in items if hasattr(x, "events")], [x for x in items if hasattr(x, "records")]


def rows(captured: Iterable[Any], spans: Sequence[Span] = ()) -> list[Row]:
    """Every event and collective of one rank in ``seq`` order, with a marker row where a compute phase (or an
    iteration) begins. Collectives take the iteration of the event before them and the current phase (backward
    when autograd issued them)."""
    event_logs, comm_logs = logs_of(captured)
    merged: dict[tuple[int, str], tuple[Any, int]] = {}
    for number, log in enumerate(event_logs, start=1):
        for event in log.events:
            merged.setdefault((event.seq, "event"), (event, number))
    for log in comm_logs:  # nested record_comm blocks would record a collective twice, with different seqs
        for record in log.records:
            merged.setdefault((record.seq, "comm"), (record, 0))
    out: list[Row] = []
    phase, iteration, recording, opened = "", 0, 1, ("", 0, 0)
    for (seq, what), (item, number) in sorted(merged.items()):
        if what == "event":
            iteration, recording = item.iteration, number
            phase = _phase_at(item, phase, iteration_changed=bool(out) and out[-1].iteration != iteration)
            row = Row(seq, iteration, phase, _EVENT_LANES.get(item.kind, "F"), event_text(item), item.source, item.via)
        else:
            lane = "U" if item.op == "all_gather" else "C"
            here = "backward" if item.in_backward else phase
            row = Row(seq, iteration or 1, here, lane, collective_text(item), item.source, recording=recording)
        row = replace(row, recording=recording, anchor=anchor_of(row, spans))
        if row.phase and (row.phase, row.iteration, row.recording) != opened:
            opened = (row.phase, row.iteration, row.recording)
            out.append(Row(seq, row.iteration, row.phase, "F", row.phase, recording=recording, marker=True))
        out.append(row)
        if what == "event" and item.kind == "final_callback":
            phase = ""
    return out


def _phase_at(event: Any, phase: str, *, iteration_changed: bool) -> str:
    if event.kind == "root_pre_forward":
        return "forward"
    if event.kind in _BACKWARD_KINDS:
        return "backward"
    if phase and not iteration_changed:
        return phase
    if "BACKWARD" in event.state:  # no hook seen yet in this recording: the unit's training state says
        return "backward"
    return "forward" if event.state == "FORWARD" else phase


def anchor_of(row: Row, spans: Sequence[Span]) -> str | None:
    """The narrowest span holding the row's source or via line (a statement anchor inside a function anchor is
    the more specific reading)."""
    holding = [s for s in spans for where in (row.source, row.via) if where and s.contains(where)]
    return min(holding, key=lambda s: s.end - s.start).name if holding else None


def iterations(timeline: Sequence[Row]) -> list[int]:
    return sorted({r.iteration for r in timeline})


def lane_cell(lane: str) -> str:
    """The row's letter in its lane's position, dots in the others: ``··P··``."""
    return "".join(letter if letter == lane else "·" for letter, _ in LANES)
