"""One owner for the ``__code__`` of functions that observers swap, rank-side.

Two observers run a function's calls through other code while they watch it: runtime evidence
(`checks.ranks.marks`) installs a copy of the function's code with a first-call mark in front, and the FSDP event
recorder (`checks.probes.calls`) installs a trampoline. Both may watch one function at once (a claim's evidence
and its check's recorder), and either may stop first, so neither assigns ``__code__`` itself: each sets its layer
on the function's `Slot`, and the slot installs the outermost one (the trampoline, then the mark, then the
original). The trampoline runs the original code and fires a pending mark itself.

A frame running marked code has that code as ``f_code``, not the original: code that compares frames with a
function's code (``frame.f_code is some_code``) must compare `code_of` the frame.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(eq=False)
class Slot:
    function: types.FunctionType
    original: types.CodeType
    trampoline: types.CodeType | None = None  # `checks.probes.calls`', while it has subscriptions
    marked: types.CodeType | None = None  # `checks.ranks.marks`', while a mark is pending
    fire: Callable[[], None] | None = None  # the pending mark, for a trampoline to fire (set with ``marked``)

    def install(self) -> None:
        code = self.trampoline or self.marked or self.original
        if self.function.__code__ is not code:
            self.function.__code__ = code


_slots: dict[types.FunctionType, Slot] = {}
_marked_originals: dict[types.CodeType, types.CodeType] = {}  # marked code -> the original it copies


def slot_of(function: types.FunctionType) -> Slot:
    """The function's slot (made on first use, from the code it has now, mapped back to its original)."""
    slot = _slots.get(function)
    if slot is None:
        slot = _slots[function] = Slot(function, original(function.__code__))
    return slot


def register_marked(marked: types.CodeType, original_code: types.CodeType) -> None:
    _marked_originals[marked] = original_code


def original(code: types.CodeType) -> types.CodeType:
    """The function's own code for a marked copy of it; any other code as it is."""
    return _marked_originals.get(code, code)


def code_of(frame: types.FrameType) -> types.CodeType:
    """The code ``frame`` runs, as the function's own: its original when it runs a marked copy."""
    return _marked_originals.get(frame.f_code, frame.f_code)
