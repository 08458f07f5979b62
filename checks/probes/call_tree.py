"""Which of some chosen torch functions ran, nested as they called each other: ``with record_call_tree(symbols,
look) as calls: ...``.

Each observed call becomes a `Call`: the function's qualified name, what ``look`` read from its frame at entry
(before the function changed anything: say, whether a state was already the root), and the observed calls made
while it ran, in order. A call made while no observed function runs is a root of the tree: a hook that autograd,
an ``nn.Module`` or the engine's final-callback queue called. It is how guide 22 reads FSDP2's step map: which
hook ran, and which of FSDP's functions it called, down to the collectives.

How: `checks.probes.calls` swaps the observed functions' code (no trace function), so every caller reaches the
trampoline, autograd's hooks included. Backward runs on the calling thread while recording
(``torch.autograd.set_multithreading_enabled(False)``), so the tree has one order. A call that raises is popped
as it unwinds. A symbol a new torch removed fails when the recording starts, naming it; an ``optional`` one is
left out where it does not exist.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from checks.probes import calls
from checks.ranks.symbols import resolve

Look = Callable[[str, types.FrameType], dict[str, Any]]  # (qualified name, frame at entry) -> what to keep


@dataclass
class Call:
    name: str  # the function's qualified name, e.g. "FSDPParamGroup.unshard"
    seen: dict[str, Any]  # what ``look`` read from its frame at entry
    calls: list[Call] = field(default_factory=list)  # observed calls made while it ran, in order

    def walk(self) -> Iterator[Call]:
        """This call, then every call under it, depth first."""
        yield self
        for call in self.calls:
            yield from call.walk()

    def made(self, name: str) -> bool:
        """Whether an observed call named ``name`` ran under this one."""
        return any(call.name == name for call in self.walk() if call is not self)


class CallTreeFailed(AssertionError):
    """The recorder's own hook raised: the tree is incomplete."""


def _exists(symbol: str) -> bool:
    try:
        resolve(symbol)
    except (AttributeError, ImportError, KeyError, ValueError):
        return False
    return True


@contextmanager
def record_call_tree(
    symbols: Sequence[str], look: Look | None = None, *, optional: Sequence[str] = ()
) -> Iterator[list[Call]]:
    """Record every call of ``symbols`` (and of those ``optional`` symbols this torch has) in the block, as a
    list of root calls, each with the observed calls it made."""
    roots: list[Call] = []
    stack: list[Call] = []

    def observer(name: str) -> Callable[[types.FrameType], Callable[[types.FrameType, Any], None]]:
        def on_call(frame: types.FrameType) -> Callable[[types.FrameType, Any], None]:
            call = Call(name, look(name, frame) if look is not None else {})
            (stack[-1].calls if stack else roots).append(call)
            stack.append(call)

            def on_return(frame: types.FrameType, value: Any) -> None:
                while stack and stack[-1] is not call:  # a call below that raised past its return
                    stack.pop()
                if stack:
                    stack.pop()

            return on_return

        return on_call

    present = [*symbols, *(s for s in optional if _exists(s))]
    hooks = {calls.function_code(symbol): observer(symbol.split(":")[1]) for symbol in present}
    with torch.autograd.set_multithreading_enabled(False), calls.subscribed(hooks) as subscription:
        yield roots
    if subscription.errors:
        error = subscription.errors[0]
        raise CallTreeFailed(f"the call recorder's hook failed, so its tree is incomplete: {error!r}") from error
