"""Memory over one step: a snapshot by category after each FSDP1 unit's forward and after each unit's
post-backward, plus any moments a check marks itself: ``with record_memory_series(model, optim) as series:``.

Each point is a `checks.probes.memory.snapshot` (distinct live storages by category, exact bytes), taken when
``_post_forward`` or ``_post_backward_hook`` returns, so it shows what that unit's reshard left allocated. The
points are observed as `record_events` observes FSDP (`checks.probes.calls`: the functions' code is swapped, no
trace function), so the two coexist. What a snapshot cannot see (activations, autograd's saved tensors, allocator
slack) it does not draw: a peak needs `account_memory`'s trackers.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from checks.naming import unit_name
from checks.probes import calls
from checks.probes.memory import snapshot

_RU = "torch.distributed.fsdp._runtime_utils"


@dataclass
class MemorySeries:
    """What `record_memory_series` recorded on one rank: (moment, bytes by category) in order."""

    rank: int = -1
    points: list[tuple[str, dict[str, int]]] = field(default_factory=list)

    def at(self, moment: str) -> dict[str, int]:
        for label, by_category in self.points:
            if label == moment:
                return by_category
        raise KeyError(f"no point {moment!r}; points: {[label for label, _ in self.points]}")


class _Series:
    def __init__(self, model: nn.Module, optim: torch.optim.Optimizer | None, series: MemorySeries) -> None:
        self.model, self.optim, self.series = model, optim, series
        self.units = {id(module): unit_name(path) for path, module in model.named_modules()}

    def mark(self, moment: str) -> None:
        self.series.points.append((moment, snapshot(self.model, self.optim).by_category))

    def after(self, phase: str, module_of: Any) -> calls.CallHook:
        def on_call(frame: types.FrameType) -> calls.ReturnHook:
            module = module_of(frame.f_locals)

            def on_return(frame: types.FrameType, value: Any) -> None:
                self.mark(f"{phase} {self.units.get(id(module), '?')}")

            return on_return

        return on_call


@contextmanager
def record_memory_series(model: nn.Module, optim: torch.optim.Optimizer | None = None) -> Iterator[Any]:
    """Yields a recorder with ``.mark(moment)`` and ``.series`` (a `MemorySeries`); points are added after each
    FSDP1 unit's post-forward and post-backward."""
    series = MemorySeries(rank=dist.get_rank() if dist.is_initialized() else 0)
    recorder = _Series(model, optim, series)
    hooks: dict[types.CodeType, calls.CallHook] = {}
    for symbol, phase, module_of in (
        (f"{_RU}:_post_forward", "forward", lambda local: local["module"]),
        (f"{_RU}:_post_backward_hook", "backward", lambda local: local["handle"]._fully_sharded_module),
    ):
        hooks[calls.function_code(symbol)] = recorder.after(phase, module_of)
    with torch.autograd.set_multithreading_enabled(False), calls.subscribed(hooks) as subscription:
        yield recorder
    if subscription.errors:
        raise RuntimeError(f"the memory series recorder failed: {subscription.errors[0]!r}") from subscription.errors[0]


@contextmanager
def record_forward_memory(model: nn.Module, units: dict[str, nn.Module]) -> Iterator[Any]:
    """A memory series for any sharding (FSDP2 included): a snapshot after each of ``units`` (name → module)
    finishes its forward, taken by a forward hook registered now, so it runs after the unit's own post-forward
    (FSDP2's reshard, or the prefetches it issued). Yields the recorder: ``.mark(moment)``, ``.series``."""
    series = MemorySeries(rank=dist.get_rank() if dist.is_initialized() else 0)
    recorder = _Series(model, None, series)
    handles = [
        module.register_forward_hook(lambda *_, name=name: recorder.mark(f"forward {name}"))
        for name, module in units.items()
    ]
    try:
        yield recorder
    finally:
        for handle in handles:
            handle.remove()
