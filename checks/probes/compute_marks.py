"""When each FSDP1 unit's backward computation starts, by a hook on each of its output tensors (guides 04, 06).

A forward hook on the unit registers the tensor hooks. FSDP's own pre-backward hook is registered on the same
tensors inside ``FSDP.forward`` (``_post_forward``), before the forward hook runs, and tensor hooks run in
registration order: so the mark is taken right after FSDP's pre-backward hook and before autograd computes the
unit's gradients.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from checks.probes import clock


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _tensors(item)


class ComputeMarks:
    """Clock ticks taken when each unit's backward computation starts (see the module docstring); ``on_mark``,
    when set, is called with the unit's name at the same moment. Only the first mark per unit counts."""

    def __init__(self, units: Mapping[str, nn.Module]) -> None:
        self.seq: dict[str, int] = {}
        self.on_mark: Callable[[str], None] | None = None
        for name, unit in units.items():
            unit.register_forward_hook(functools.partial(self._arm, name))

    def _arm(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        def fire(grad: torch.Tensor) -> None:
            if name not in self.seq:
                self.seq[name] = clock.tick()
                if self.on_mark is not None:
                    self.on_mark(name)

        for tensor in _tensors(output):
            if tensor.requires_grad:
                tensor.register_hook(fire)
