"""Runtime evidence: which of the given functions ran inside a block, without a trace function.

`watch` gives each watched function, for the length of the block, a copy of its code with a call to a mark in
front of its first instruction (after ``RESUME``, so a generator marks when it first runs, as a trace function's
``call`` event would). The mark records the function's symbols and puts the function's own code back: from its
second call on the function runs unchanged, and nothing else in the process is slowed. A trace function
(``sys.settrace``), which this replaced, puts every frame of the rank through CPython's tracing path for the whole
check.

What stays as it was: no frame is added (a ``warnings.warn(stacklevel=...)`` inside a watched function points
where it did, which guide 09's warning claims check), line numbers and exception handling are the original's, and
no module namespace changes. What differs: the first call's frame runs the marked copy, so its ``f_code`` is not
the function's code (`checks.ranks.codeswap.code_of` maps it back). Functions share their slot with the FSDP event
recorder's trampolines (`checks.ranks.codeswap`). On an interpreter whose bytecode this module does not write
(anything but CPython 3.11), functions are watched through the trace multiplexer (`checks.ranks.tracing`).
"""

from __future__ import annotations

import dis
import opcode
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from checks.ranks import codeswap, tracing
from checks.ranks.symbols import functions

MARKS_BYTECODE = sys.implementation.name == "cpython" and sys.version_info[:2] == (3, 11)

Pending = tuple[set[str], tuple[str, ...]]  # (a watch's set, the symbols this function marks in it)


class _Mark:
    """One function's mark: the marked copy of its code (built once per process), and the watches waiting for the
    function's first call."""

    def __init__(self, slot: codeswap.Slot) -> None:
        self.slot = slot
        self.pending: list[Pending] = []
        self.code = marked_code(slot.original, self.fire) if MARKS_BYTECODE else None
        if self.code is not None:
            codeswap.register_marked(self.code, slot.original)

    def arm(self, entry: Pending) -> None:
        self.pending.append(entry)
        self.slot.marked, self.slot.fire = self.code, self.fire
        self.slot.install()

    def disarm(self, entry: Pending) -> None:
        self.pending = [p for p in self.pending if p is not entry]
        if not self.pending:
            self._uninstall()

    def fire(self) -> None:
        """What the marked code's first instruction calls (or a trampoline, `checks.probes.calls`)."""
        try:
            pending, self.pending = self.pending, []
            for seen, symbols in pending:
                seen.update(symbols)
            self._uninstall()
        except Exception:  # a mark must never change what the marked function does
            return

    def _uninstall(self) -> None:
        self.slot.marked = self.slot.fire = None
        self.slot.install()


_marks: dict[types.FunctionType, _Mark] = {}


def _mark_of(function: types.FunctionType) -> _Mark:
    mark = _marks.get(function)
    if mark is None:
        mark = _marks[function] = _Mark(codeswap.slot_of(function))
    return mark


@contextmanager
def watch(symbols: tuple[str, ...]) -> Iterator[set[str]]:
    """Yield a set that fills with the symbols whose code ran inside the block."""
    seen: set[str] = set()
    # A function can belong to several symbols (a method, and the class anchored as a whole): its first call
    # marks every one of them.
    owners: dict[types.FunctionType, list[str]] = {}
    for symbol in symbols:
        for function in functions(symbol):
            owners.setdefault(function, []).append(symbol)
    armed: list[tuple[_Mark, Pending]] = []
    traced: dict[types.CodeType, tracing.CallHook] = {}
    for function, names in owners.items():
        mark = _mark_of(function)
        if mark.code is None:
            traced[mark.slot.original] = _marker(seen, tuple(names))
            continue
        entry = (seen, tuple(names))
        mark.arm(entry)
        armed.append((mark, entry))
    try:
        with tracing.subscribed(traced) if traced else nullcontext():
            yield seen
    finally:
        for mark, entry in armed:
            mark.disarm(entry)


def _marker(seen: set[str], symbols: tuple[str, ...]) -> tracing.CallHook:
    def on_call(frame: types.FrameType) -> None:
        seen.update(symbols)

    return on_call


# -- the marked copy (CPython 3.11 bytecode) ----------------------------------------------------------------------
# Code units are 2 bytes (opcode, argument); jumps are relative, so code inserted before every jump and its target
# leaves them right. The exception table's offsets are absolute, and the location table is a run of entries
# covering 1-8 units each: both are rewritten around the inserted units, which get "no location" entries.

_NO_LOCATION = 15
_LONG, _NO_COLUMNS, _ONE_LINE = 14, 13, 10


def marked_code(code: types.CodeType, fire: object) -> types.CodeType | None:
    """``code`` with ``fire()`` called at its first instruction; None when it has no ``RESUME`` to follow."""
    units = code.co_code
    resume = dis.opmap["RESUME"]
    at = next((i // 2 + 1 for i in range(0, len(units), 2) if units[i] == resume), None)
    if at is None:
        return None
    prologue = (
        _instruction("PUSH_NULL")
        + _instruction("LOAD_CONST", len(code.co_consts))
        + _instruction("PRECALL", 0)
        + _instruction("CALL", 0)
        + _instruction("POP_TOP")
    )
    added = len(prologue) // 2
    return code.replace(
        co_code=units[: at * 2] + prologue + units[at * 2 :],
        co_consts=(*code.co_consts, fire),
        co_stacksize=max(code.co_stacksize, 2),  # the stack is empty after RESUME; the call needs NULL and fire
        co_exceptiontable=_shifted_exceptions(code.co_exceptiontable, at, added),
        co_linetable=_located(code.co_linetable, at, added),
    )


def _instruction(name: str, arg: int = 0) -> bytes:
    """One instruction with its EXTENDED_ARG prefixes and its inline cache units."""
    op = dis.opmap[name]
    parts = [arg & 0xFF]
    while arg > 0xFF:
        arg >>= 8
        parts.insert(0, arg & 0xFF)
    extended = b"".join(bytes((dis.opmap["EXTENDED_ARG"], part)) for part in parts[:-1])
    return extended + bytes((op, parts[-1])) + bytes(2 * opcode._inline_cache_entries[op])


def _shifted_exceptions(table: bytes, at: int, added: int) -> bytes:
    """The exception table with ``added`` units inserted at unit ``at``: offsets from there on move, and an entry
    that spans ``at`` grows."""
    out = bytearray()
    position = 0
    while position < len(table):
        fields = []
        for _ in range(4):
            value, position = _read_exception_varint(table, position)
            fields.append(value)
        start, size, target, depth_lasti = fields
        end = start + size
        if start >= at:
            start, end = start + added, end + added
        elif end > at:
            end += added
        if target >= at:
            target += added
        _write_exception_varint(out, start, first=True)
        _write_exception_varint(out, end - start)
        _write_exception_varint(out, target)
        _write_exception_varint(out, depth_lasti)
    return bytes(out)


def _read_exception_varint(table: bytes, position: int) -> tuple[int, int]:
    """6 bits a byte, most significant first, 0x40 = more follows (0x80 marks an entry's first byte)."""
    byte = table[position]
    value = byte & 63
    position += 1
    while byte & 64:
        byte = table[position]
        value = (value << 6) | (byte & 63)
        position += 1
    return value, position


def _write_exception_varint(out: bytearray, value: int, *, first: bool = False) -> None:
    chunks = [value & 63]
    while value >= 64:
        value >>= 6
        chunks.insert(0, value & 63)
    for index, chunk in enumerate(chunks):
        more = 64 if index < len(chunks) - 1 else 0
        out.append(chunk | more | (128 if first and index == 0 else 0))


def _located(table: bytes, at: int, added: int) -> bytes:
    """The location table with ``added`` no-location units inserted at unit ``at``; the entry that covers ``at``
    is split in two with its location kept (the second half on the same line: a line delta of 0)."""
    inserted = b"".join(_entry_head(_NO_LOCATION, min(8, added - n)) for n in range(0, added, 8))
    unit = 0
    position = 0
    while position < len(table):
        head = table[position]
        kind, length = (head >> 3) & 15, (head & 7) + 1
        end = _entry_end(table, position, kind)
        if unit == at:
            return table[:position] + inserted + table[position:]
        if unit < at < unit + length:
            before, after = at - unit, unit + length - at
            first = _entry_head(kind, before) + table[position + 1 : end]
            return table[:position] + first + inserted + _same_line(table, position, end, kind, after) + table[end:]
        unit += length
        position = end
    return table + inserted


def _entry_head(kind: int, length: int) -> bytes:
    return bytes((0x80 | (kind << 3) | (length - 1),))


def _entry_end(table: bytes, position: int, kind: int) -> int:
    """The offset just past the entry at ``position``."""
    position += 1
    if kind == _NO_LOCATION:
        return position
    if kind == _LONG:
        for _ in range(4):  # line delta, end line delta, column + 1, end column + 1
            position = _skip_location_varint(table, position)
        return position
    if kind == _NO_COLUMNS:
        return _skip_location_varint(table, position)
    return position + (2 if kind >= _ONE_LINE else 1)  # one-line forms: two column bytes; short forms: one


def _skip_location_varint(table: bytes, position: int) -> int:
    """6 bits a byte, least significant first, 0x40 = more follows."""
    while table[position] & 64:
        position += 1
    return position + 1


def _same_line(table: bytes, position: int, end: int, kind: int, length: int) -> bytes:
    """An entry of ``length`` units with the location of the entry at ``position``, on the line it ends on."""
    if kind == _LONG:
        after_delta = _skip_location_varint(table, position + 1)
        return _entry_head(kind, length) + b"\x00" + table[after_delta:end]  # a line delta of 0, then as it was
    if kind == _NO_COLUMNS:
        return _entry_head(kind, length) + b"\x00"
    if _ONE_LINE <= kind < _NO_COLUMNS:
        return _entry_head(_ONE_LINE, length) + table[position + 1 : end]  # line delta 0, the same columns
    return _entry_head(kind, length) + table[position + 1 : end]  # short forms and none: no line delta
