"""What the FSDP hooks of `checks.probes.fsdp_hooks` write into while `record_events` runs."""

from __future__ import annotations

from torch import nn

from checks.naming import unit_name
from checks.probes import clock
from checks.probes.event_log import FsdpEvent


class Recording:
    """The state hooks write into: pending events, the iteration counter, unit names by module."""

    def __init__(self, model: nn.Module | None, rank: int) -> None:
        self.rank = rank
        self.iteration = 1
        self.pending: list[tuple[int, int, str, str, str, str | None, str, str, str, str]] = []
        self.notes: list[str] = []
        self._units: dict[int, str] = {}
        self._roots: list[nn.Module] = []
        if model is not None:
            self.add_root(model)

    def add_root(self, module: nn.Module) -> None:
        if any(module is root for root in self._roots):
            return
        self._roots.append(module)
        for name, sub in module.named_modules():
            self._units.setdefault(id(sub), unit_name(name))

    def unit(self, module: nn.Module | None) -> str:
        if module is None:
            return "?"
        found = self._units.get(id(module))
        if found is None:
            found = f"<{type(module).__name__}>"
            note = f"no unit name for a {type(module).__name__}: pass the model to record_events"
            if note not in self.notes:
                self.notes.append(note)
        return found

    def emit(
        self,
        kind: str,
        unit: str,
        state: str,
        *,
        api: str,
        target: str | None = None,
        detail: str = "",
        seq: int | None = None,
        iteration: int | None = None,
        source: str = "",
        via: str = "",
    ) -> None:
        self.pending.append(
            (
                clock.tick() if seq is None else seq,
                self.iteration if iteration is None else iteration,
                kind,
                unit,
                state,
                target,
                detail,
                api,
                source,
                via,
            )
        )

    def finish(self) -> list[FsdpEvent]:
        ordered = sorted(self.pending, key=lambda p: p[0])  # return-time events were stamped at call time
        return [
            FsdpEvent(i, iteration, kind, unit, state, target, detail, api, self.rank, seq, source, via)
            for i, (seq, iteration, kind, unit, state, target, detail, api, source, via) in enumerate(ordered, start=1)
        ]
