"""Runtime evidence: which of a set of code objects actually executed during a check.

A global trace function sees every new Python frame; it returns None so no line events are traced, which keeps
the overhead to one dictionary lookup per call. Threads started during the check are traced too. Autograd's own
device threads (CUDA backward) are C++ threads that never see ``sys.settrace``: on GPU, code that runs only inside
backward hooks can go unseen, so claims should also anchor code that runs in forward. On CPU, backward hooks run on
the calling thread and are seen.
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager

from checks.symbols import code_objects


@contextmanager
def watch(symbols: tuple[str, ...]) -> Iterator[set[str]]:
    """Yield a set that fills with the symbols whose code ran inside the block."""
    seen: set[str] = set()
    if not symbols:
        yield seen
        return
    owner_of: dict[types.CodeType, str] = {}
    for symbol in symbols:
        for code in code_objects(symbol):
            owner_of.setdefault(code, symbol)

    def on_call(frame: types.FrameType, event: str, arg: object) -> None:
        symbol = owner_of.get(frame.f_code)
        if symbol is not None:
            seen.add(symbol)

    previous = sys.gettrace()
    previous_threading = threading.gettrace()
    sys.settrace(on_call)
    threading.settrace(on_call)
    try:
        yield seen
    finally:
        sys.settrace(previous)
        threading.settrace(previous_threading)  # type: ignore[arg-type]
