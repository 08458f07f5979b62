"""Which storage a tensor-parallel payload is, seen from outside torch's code (guide 21's all-reduce claims).

Size cannot tell an activation from a parameter when both are 256 elements; the storage can. `PayloadWitness`
notes the storage of each partial output and each partial input gradient it is told to watch, stamped on the
probes' clock (`checks.probes.clock`), so each recorded collective (`checks.probes.comm`, whose ``storages`` are
its payloads' data pointers) is matched with the latest sighting of its storage before it: a freed storage's
address is reused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from checks.probes import clock


class PayloadWitness:
    """The storages the tensor-parallel all-reduces must move: the local tensor of each ``outputs`` module's
    output (a forward hook that runs before any other, so before a row-wise style's own output hook makes the
    ``Partial`` output whole), and of each gradient arriving at an ``inputs`` module's first input (a tensor hook
    on the DTensor a column-wise style's input hook, or a ``PrepareModuleInput``, made). Keys are the names a
    match reports."""

    def __init__(self, outputs: Mapping[str, nn.Module], inputs: Mapping[str, nn.Module]) -> None:
        self.seen: list[tuple[int, int, str, str]] = []  # (seq, storage, layer, "output" | "input gradient")
        self._handles = [m.register_forward_hook(self._output(name), prepend=True) for name, m in outputs.items()]
        self._handles += [m.register_forward_pre_hook(self._input(name)) for name, m in inputs.items()]

    def _note(self, tensor: Any, layer: str, kind: str) -> None:
        local = getattr(tensor, "_local_tensor", tensor)  # a plain tensor where no style made a DTensor
        self.seen.append((clock.tick(), local.untyped_storage().data_ptr(), layer, kind))

    def _output(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            self._note(output, name, "output")

        return hook

    def _input(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            args[0].register_hook(lambda grad: self._note(grad, name, "input gradient"))

        return hook

    def moved(self, collective: Any) -> tuple[str, str]:
        """(layer, what) whose tensor ``collective`` moved, or ("", "another tensor")."""
        before = [s for s in self.seen if s[0] < collective.seq and s[1] == collective.storages[0]]
        return (before[-1][2], before[-1][3]) if before else ("", "another tensor")

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
