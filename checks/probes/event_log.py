"""The records `record_events` returns: plain, picklable, comparable across ranks (see `checks.probes.events`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FsdpEvent:
    index: int  # position in this recording, from 1
    iteration: int
    kind: str
    unit: str  # the unit's name (`checks.naming`): ``root``, ``blocks.0``
    state: str
    target: str | None = None
    detail: str = ""
    api: str = ""  # "fsdp1" | "fsdp2"
    rank: int = -1
    seq: int = 0
    # Only when the check is captured (`checks.ranks.capture`), else "": the torch line that issued the event,
    # ``torch/distributed/fsdp/_runtime_utils.py:434``, and for a prefetch the line inside the prefetch function
    # that issued its unshard (see `checks.probes.fsdp_hooks` for which frame each kind names).
    source: str = ""
    via: str = ""

    def key(self) -> tuple[Any, ...]:
        return (self.index, self.iteration, self.kind, self.unit, self.state, self.target, self.detail)

    def describe(self) -> str:
        """Compact text used in expected-vs-observed sequences, e.g. ``prefetch root→blocks.2``, ``free 1``."""
        if self.kind == "prefetch":
            return f"prefetch {self.unit}→{self.target}"
        return f"{self.kind} {self.unit}"


@dataclass
class EventLog:
    """What `record_events` recorded on one rank."""

    rank: int = -1
    world_size: int = 0
    events: list[FsdpEvent] = field(default_factory=list)
    completed_iterations: int = 0
    notes: list[str] = field(default_factory=list)
    label: str = ""  # what the check says this recording is ("step 2, blocks reversed"), for the timeline

    def __iter__(self) -> Iterator[FsdpEvent]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def __getitem__(self, index: int) -> FsdpEvent:
        return self.events[index]

    def select(
        self, kind: str | tuple[str, ...] | None = None, *, iteration: int | None = None, unit: str | None = None
    ) -> list[FsdpEvent]:
        kinds = (kind,) if isinstance(kind, str) else kind
        return [
            e
            for e in self.events
            if (kinds is None or e.kind in kinds)
            and (iteration is None or e.iteration == iteration)
            and (unit is None or e.unit == unit)
        ]

    def sequence(self, kinds: str | tuple[str, ...] | None = None, *, iteration: int | None = None) -> list[str]:
        """`FsdpEvent.describe` of the selected events, in order: what expected sequences are written in."""
        return [e.describe() for e in self.select(kinds, iteration=iteration)]

    def prefetches(self, iteration: int | None = None) -> list[tuple[str, str]]:
        """(issuer, target) unit names of every prefetch, in order."""
        return [(e.unit, e.target or "") for e in self.select("prefetch", iteration=iteration)]

    def keys(self) -> list[tuple[Any, ...]]:
        return [e.key() for e in self.events]
