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
_ITEMSIZE = {
    "torch.float32": 4, "torch.bfloat16": 2, "torch.float16": 2, "torch.float64": 8, "torch.int32": 4,
    "torch.int64": 8, "torch.uint8": 1, "torch.int8": 1, "torch.bool": 1,
}  # fmt: skip
OUTSIDE_BACKWARD = "outside backward"  # a collective of a recording without FSDP events, not issued by autograd


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
    label: str = ""  # the recording's label, as the check gave it (`record_events(label=...)`)
    held: tuple[str, ...] = ()  # units unsharded after this row (FSDP events only), in the order they were
    held_bytes: int | None = None  # their bytes, when every one's all-gather was recorded


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
    """``all_gather 16,020 fp32 (64,080 B)``: the op, its elements, their dtype and their bytes."""
    dtype = _DTYPES.get(record.dtype, record.dtype.removeprefix("torch."))
    nbytes = record_bytes(record)
    return f"{record.op} {record.numel:,} {dtype}".rstrip() + (f" ({nbytes:,} B)" if nbytes is not None else "")


def record_bytes(record: Any) -> int | None:
    size = _ITEMSIZE.get(record.dtype)
    return record.numel * size if size is not None else None


def logs_of(captured: Iterable[Any]) -> tuple[list[Any], list[Any]]:
    """(event logs, comm logs) among a rank's captured items (anything else: an unpicklable log's note)."""
    items = list(captured)
    return [x for x in items if hasattr(x, "events")], [x for x in items if hasattr(x, "records")]


def rows(captured: Iterable[Any], spans: Sequence[Span] = ()) -> list[Row]:
    """Every event and collective of one rank in ``seq`` order, with a marker row where a compute phase (or an
    iteration, or a recording) begins. A collective takes the iteration and phase of the FSDP event before it in
    its recording, and backward whenever autograd issued it. In a recording with no FSDP events (`record_comm`
    alone) a collective is in backward when autograd issued it and outside backward otherwise, and an iteration
    ends where a backward does."""
    event_logs, comm_logs = logs_of(captured)
    merged: dict[tuple[int, str], tuple[Any, int, str]] = {}
    for number, log in enumerate(event_logs, start=1):
        for event in log.events:
            merged.setdefault((event.seq, "event"), (event, number, getattr(log, "label", "")))
    for number, log in enumerate(comm_logs, start=1):  # nested blocks would record a collective twice
        for record in log.records:
            merged.setdefault((record.seq, "comm"), (record, number, ""))
    out: list[Row] = []
    phase, iteration, recording, label, opened = "", 0, 1, "", ("", 0, 0)
    held = _Held()
    comm_only = {"iteration": 1, "was_backward": False, "log": 0}
    for (seq, what), (item, number, log_label) in sorted(merged.items()):
        if what == "event":
            if number != recording:
                held = _Held()  # a new recording: often a new model, nothing unsharded yet
            iteration, recording, label = item.iteration, number, log_label
            phase = _phase_at(item, phase, iteration_changed=bool(out) and out[-1].iteration != iteration)
            held.event(item)
            row = Row(seq, iteration, phase, _EVENT_LANES.get(item.kind, "F"), event_text(item), item.source, item.via)
        else:
            lane = "U" if item.op == "all_gather" else "C"
            held.collective(item)
            if event_logs:
                here, at = ("backward" if item.in_backward else phase), iteration or 1
            else:  # no FSDP event to say where this is: autograd says backward, nothing says forward
                if -number != comm_only["log"]:
                    comm_only.update(iteration=1, was_backward=False, log=-number)
                if comm_only["was_backward"] and not item.in_backward:
                    comm_only["iteration"] += 1
                comm_only["was_backward"] = item.in_backward
                here, at, recording = (
                    ("backward" if item.in_backward else OUTSIDE_BACKWARD),
                    comm_only["iteration"],
                    -number,
                )
            row = Row(seq, at, here, lane, collective_text(item), item.source, recording=recording)
        row = replace(row, recording=recording, label=label, anchor=anchor_of(row, spans), **held.now())
        if row.phase and (row.phase, row.iteration, row.recording) != opened:
            opened = (row.phase, row.iteration, row.recording)
            marker = Row(seq, row.iteration, row.phase, "F", row.phase, recording=recording, marker=True, label=label)
            out.append(marker)
        out.append(row)
        if what == "event" and item.kind == "final_callback":
            phase = ""
    return out


class _Held:
    """Which units hold unsharded parameters, from the unshard and free events, and their bytes, from the
    all-gather each unshard issued (None when one was not recorded)."""

    def __init__(self) -> None:
        self.units: list[str] = []
        self.sizes: dict[str, int] = {}
        self.gathering: str | None = None  # the unit whose unshard's all-gather comes next

    def event(self, event: Any) -> None:
        """An unshard holds its unit (one with no all-gather found it held already), a prefetch its target, a
        free lets its unit go; a reshard that keeps the storage (FSDP1's root) changes nothing."""
        unit = event.target if event.kind == "prefetch" else event.unit
        if event.kind in ("unshard", "prefetch"):
            if event.kind == "prefetch" or event.detail != "no all-gather":
                self.gathering = unit
            if unit not in self.units:
                self.units.append(unit)
        elif event.kind == "free" and unit in self.units:
            self.units.remove(unit)

    def collective(self, record: Any) -> None:
        if record.op == "all_gather" and self.gathering is not None:
            nbytes = record_bytes(record)
            if nbytes is not None:
                self.sizes[self.gathering] = nbytes
            self.gathering = None

    def now(self) -> dict[str, Any]:
        known = all(unit in self.sizes for unit in self.units)
        total = sum(self.sizes[u] for u in self.units) if known else None
        return {"held": tuple(self.units), "held_bytes": total}


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
