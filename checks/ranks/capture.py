"""Opt-in collection of every probe log a check records, and the torch source line each record came from.

A check returns what its claim needs; a view of the whole step (``fsdp-readings timeline``) needs every log its
probes recorded, including the ones the check only asserted on and dropped, and those of a check that failed
half way. With ``CheckRequest(capture=True)`` the rank runs the check inside `collecting`: each `record_events`
and `record_comm` block that finishes appends its log here (also when the block raised), and the list comes back
as ``RankResult.captured``.

Only while collecting do recorders look up source lines (`where`, `defined_at`): frame walks and file reads are
kept off the path every other check takes, whose cost the probe benchmarks measure.

Rank-local and single-threaded by design: one check runs at a time in a rank process.
"""

from __future__ import annotations

import linecache
import os
import types
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

_collected: list[Any] | None = None
_recorded: set[str] = set()  # the kinds of recording finished since `recorded_since_reset` last asked


def active() -> bool:
    """Whether a check is being captured (recorders attribute source lines only then)."""
    return _collected is not None


@contextmanager
def collecting() -> Iterator[list[Any]]:
    """Collect every probe log finished inside the block into the yielded list."""
    global _collected  # noqa: PLW0603 - one collector per rank process, by design
    previous, _collected = _collected, []
    try:
        yield _collected
    finally:
        _collected = previous


def add(log: Any) -> None:
    """A finished recording: kept when a check is captured, ignored otherwise; its kind (``events``, ``comm``) is
    noted either way, so a rank can say which views a check's run can draw (`recorded_since_reset`)."""
    _recorded.add(kind_of(log))
    if _collected is not None:
        _collected.append(log)


def kind_of(log: Any) -> str:
    """``events`` for an FSDP event log, ``comm`` for a collective log (duck-typed: no probe imports here)."""
    return "events" if hasattr(log, "events") else "comm" if hasattr(log, "records") else type(log).__name__


def recorded_since_reset() -> frozenset[str]:
    """The kinds of recording finished since the last call (which starts the next count)."""
    found = frozenset(_recorded)
    _recorded.clear()
    return found


@cache
def _torch_parent() -> str:
    import torch  # the recorders already imported it; resolved once, here, so this module stays torch-free

    return os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))  # noqa: PTH120, PTH100


def relative(filename: str) -> str:
    """A file as the guides cite it: relative to the directory holding ``torch/`` (``torch/distributed/...``),
    the same convention as `reader.source.anchors.Resolution.relpath`; a file outside it stays absolute."""
    parent = _torch_parent()
    absolute = os.path.abspath(filename)  # noqa: PTH100
    if absolute.startswith(parent + os.sep):
        return absolute[len(parent) + 1 :].replace(os.sep, "/")
    return absolute


def where(frame: types.FrameType) -> str:
    """``file:line`` of the line ``frame`` is executing now (for a caller: the call in progress)."""
    return f"{relative(frame.f_code.co_filename)}:{frame.f_lineno}"


def defined_at(frame: types.FrameType) -> str:
    """``file:line`` of the ``def`` line of ``frame``'s function, past its decorators (``co_firstlineno`` is the
    first decorator's line; a decorator's arguments may span lines)."""
    code = frame.f_code
    first = code.co_firstlineno
    for line in range(first, first + _DECORATOR_LINES):
        if linecache.getline(code.co_filename, line).lstrip().startswith(("def ", "async def ")):
            return f"{relative(code.co_filename)}:{line}"
    return f"{relative(code.co_filename)}:{first}"


_DECORATOR_LINES = 40  # how far below co_firstlineno the def line is looked for
