"""Runtime evidence without a trace function (`checks.ranks.marks`): which functions ran, and that marking them
changes nothing else about how they run."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import dis
import functools
import importlib
import pkgutil
import sys
import threading
import traceback
import types
import warnings
from collections.abc import Iterator

import pytest

from checks.probes import calls
from checks.ranks import codeswap, marks
from checks.ranks.symbols import functions

pytestmark = pytest.mark.skipif(not marks.MARKS_BYTECODE, reason="marks are written as CPython 3.11 bytecode")
HERE = __name__


def plain(x: int, *rest: int, scale: int = 1, **named: int) -> int:
    return (x + sum(rest) + sum(named.values())) * scale


def counter(n: int) -> Iterator[int]:
    yield from range(n)


@contextlib.contextmanager
def opened(log: list[str]) -> Iterator[str]:
    log.append("enter")
    try:
        yield "inside"
    finally:
        log.append("exit")


def make_closure(base: int) -> types.FunctionType:
    def add(x: int) -> int:
        return x + base

    return add


closure = make_closure(10)


def with_cell(x: int) -> int:
    def inner() -> int:
        return x * 2

    return inner()


def raises_inside(x: int) -> int:
    try:
        return 1 // x
    except ZeroDivisionError:
        return -1


def warns(stacklevel: int) -> None:
    warnings.warn("from a watched function", UserWarning, stacklevel=stacklevel)


def fails() -> None:
    raise ValueError("boom")


@functools.cache
def cached(x: int) -> int:
    return x * 3


async def coroutine(x: int) -> int:
    await asyncio.sleep(0)
    return x + 1


class Holder:
    def method(self) -> int:
        return 1

    def unused(self) -> int:
        return 2

    @property
    def prop(self) -> int:
        return 3

    @staticmethod
    def static() -> int:
        return 4

    @classmethod
    def klass(cls) -> int:
        return 5


@dataclasses.dataclass
class Point:
    x: int
    y: int = 0


VALUES = ", ".join(f"'c{i}'" for i in range(300))
MANY_CONSTANTS = f"def many():\n    values = [{VALUES}]\n    return len(values)\n"
namespace: dict[str, object] = {"__name__": HERE}
exec(compile(MANY_CONSTANTS, __file__, "exec"), namespace)
many = namespace["many"]  # more than 256 constants: the mark's LOAD_CONST needs an EXTENDED_ARG


def symbol(name: str) -> str:
    return f"{HERE}:{name}"


@pytest.fixture(autouse=True)
def _no_trace_function_and_code_restored() -> Iterator[None]:
    codes = {f: f.__code__ for f in (plain, counter, closure, with_cell, raises_inside, warns, fails, Holder.method)}
    yield
    assert sys.gettrace() is None
    for function, code in codes.items():
        assert function.__code__ is code, f"{function.__qualname__} kept a marked copy"


def test_marks_what_ran_and_only_that() -> None:
    watched = ("plain", "with_cell", "raises_inside", "cached", "many", "closure", "Holder.unused")
    with marks.watch(tuple(symbol(n) for n in watched)) as seen:
        assert sys.gettrace() is None  # no trace function: the rest of the process runs at full speed
        assert plain(1, 2, 3, scale=2, a=4) == 20
        assert with_cell(4) == 8
        assert raises_inside(0) == -1 and raises_inside(1) == 1
        assert cached(2) == 6
        assert many() == 300
        assert closure(1) == 11
    assert seen == {symbol(n) for n in watched if n != "Holder.unused"}


def test_a_function_runs_its_own_code_again_after_its_first_call() -> None:
    with marks.watch((symbol("plain"),)):
        assert plain.__code__ is not plain_code  # the marked copy, until the first call
        plain(1)
        assert plain.__code__ is plain_code
        assert plain(2, 3) == 5


plain_code = plain.__code__


def test_a_generator_marks_when_it_first_runs_not_when_it_is_made() -> None:
    log: list[str] = []
    with marks.watch((symbol("counter"), symbol("opened"))) as seen:
        numbers = counter(3)
        assert seen == set()
        assert list(numbers) == [0, 1, 2]
        with opened(log) as value:
            assert value == "inside"
    assert seen == {symbol("counter"), symbol("opened")} and log == ["enter", "exit"]


def test_a_coroutine_marks_when_it_runs() -> None:
    with marks.watch((symbol("coroutine"),)) as seen:
        assert asyncio.run(coroutine(1)) == 2
    assert seen == {symbol("coroutine")}


def test_a_class_marks_with_any_of_its_methods_and_accessors() -> None:
    cls, method = symbol("Holder"), symbol("Holder.method")
    with marks.watch((cls, method, symbol("Holder.unused"), symbol("Holder.prop"))) as seen:
        Holder().method()
    assert seen == {cls, method}
    with marks.watch((symbol("Holder.prop"), symbol("Holder.static"), symbol("Holder.klass"))) as seen:
        assert (Holder().prop, Holder.static(), Holder.klass()) == (3, 4, 5)
    assert seen == {symbol("Holder.prop"), symbol("Holder.static"), symbol("Holder.klass")}


def test_dataclass_generated_methods_mark() -> None:
    with marks.watch((symbol("Point"),)) as seen:
        assert Point(1) == Point(1, 0)
    assert seen == {symbol("Point")}


def test_nested_watches_of_one_function_each_see_it_and_may_leave_in_any_order() -> None:
    outer = marks.watch((symbol("plain"), symbol("with_cell")))
    outer_seen = outer.__enter__()
    with marks.watch((symbol("plain"),)) as inner_seen:
        plain(1)
    outer_left_first = marks.watch((symbol("with_cell"),))
    late = outer_left_first.__enter__()
    outer.__exit__(None, None, None)  # not LIFO
    with_cell(1)
    outer_left_first.__exit__(None, None, None)
    assert inner_seen == {symbol("plain")} and outer_seen == {symbol("plain")} and late == {symbol("with_cell")}


def test_a_first_call_in_another_thread_marks() -> None:
    with marks.watch((symbol("plain"),)) as seen:
        worker = threading.Thread(target=plain, args=(1,))
        worker.start()
        worker.join()
    assert seen == {symbol("plain")}


def _warning_site(stacklevel: int) -> tuple[str, int]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warns(stacklevel)  # the line stacklevel=2 names
    return caught[0].filename, caught[0].lineno


def _warning_sites() -> list[tuple[str, int]]:
    return [_warning_site(level) for level in (1, 2, 3)]  # the line stacklevel=3 names


def test_a_warning_names_the_same_line_from_a_marked_function() -> None:
    """No frame is added: ``stacklevel`` reaches the same caller (what guide 09's warning claims read)."""
    expected = _warning_sites()
    assert len(set(expected)) == 3
    marked = []
    for level in (1, 2, 3):
        with marks.watch((symbol("warns"),)) as seen:  # each level on a first call, through the marked copy
            marked.append(_warning_sites()[level - 1])
        assert seen == {symbol("warns")}
    assert marked == expected


def _traceback_of_failure() -> list[tuple[str, int | None, str]]:
    try:
        fails()
    except ValueError as exc:
        return [(f.name, f.lineno, f.line) for f in traceback.extract_tb(exc.__traceback__)]
    raise AssertionError("fails() did not raise")


def test_a_traceback_through_a_marked_function_is_unchanged() -> None:
    expected = _traceback_of_failure()
    with marks.watch((symbol("fails"),)) as seen:
        assert _traceback_of_failure() == expected
    assert seen == {symbol("fails")}


def test_the_frame_of_a_marked_call_maps_back_to_the_function_code() -> None:
    frames: list[types.FrameType] = []

    def spy(x: int) -> int:
        frames.append(sys._getframe())
        return x

    module = types.ModuleType("spy_module")
    module.spy = spy
    sys.modules["spy_module"] = module
    try:
        original = spy.__code__
        with marks.watch(("spy_module:spy",)):
            spy(1)
            spy(2)
    finally:
        del sys.modules["spy_module"]
    assert frames[0].f_code is not original and codeswap.code_of(frames[0]) is original  # the marked copy
    assert frames[1].f_code is original and codeswap.code_of(frames[1]) is original


def test_an_event_trampoline_over_a_marked_function_fires_the_mark_in_either_order() -> None:
    """The FSDP event recorder and runtime evidence may watch one function: whichever comes first, the call is
    seen by both, and the function's own code is back once both have left."""
    code = calls.function_code(symbol("plain"))
    hits: list[int] = []
    with marks.watch((symbol("plain"),)) as seen, calls.subscribed({code: lambda frame: hits.append(1)}):
        assert plain(1) == 1
    assert seen == {symbol("plain")} and hits == [1]
    with calls.subscribed({code: lambda frame: hits.append(2)}):
        with marks.watch((symbol("plain"),)) as seen:
            assert plain(2) == 2
        assert plain.__code__ is not code  # the trampoline, still
    assert seen == {symbol("plain")} and hits == [1, 2]


def test_without_marks_the_trace_multiplexer_watches(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an interpreter marks cannot write, the same answers come from the trace multiplexer."""
    monkeypatch.setattr(marks, "MARKS_BYTECODE", False)
    monkeypatch.setattr(marks, "_marks", {})
    with marks.watch((symbol("plain"), symbol("Holder.unused"))) as seen:
        assert sys.gettrace() is not None
        plain(1)
    assert seen == {symbol("plain")}


def _torch_functions() -> list[types.FunctionType]:
    import torch.distributed.fsdp
    import torch.nn.parallel.distributed

    modules = [torch.nn.parallel.distributed, torch.distributed.distributed_c10d]
    for info in pkgutil.walk_packages(torch.distributed.fsdp.__path__, "torch.distributed.fsdp."):
        with contextlib.suppress(ImportError):
            modules.append(importlib.import_module(info.name))
    found: dict[types.FunctionType, None] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated module attributes warn when read
        for module in modules:
            for name, value in vars(module).items():
                if getattr(value, "__module__", module.__name__) == module.__name__ and not name.startswith("__"):
                    found.update(dict.fromkeys(functions(f"{module.__name__}:{name}")))
    return list(found)


def _moved(entry: object, at: int, added: int) -> tuple[int, int, int, int, bool]:
    """An exception table entry as the marked copy must have it: what starts or ends past ``at`` moves."""
    start, end, target = (entry.start, entry.end, entry.target)  # type: ignore[attr-defined]
    moved_start = start + added if start >= at else start
    moved_end = end + added if end > at else end
    moved_target = target + added if target >= at else target
    return moved_start, moved_end, moved_target, entry.depth, entry.lasti  # type: ignore[attr-defined]


def test_every_marked_copy_of_fsdp_code_keeps_its_lines_and_handlers() -> None:
    """Over every function of torch's FSDP, DDP and c10d modules: the marked copy's code, locations and exception
    table are the original's with the mark's units spliced in after ``RESUME`` (no location), and nothing else."""
    codes = {f.__code__ for f in _torch_functions()}
    assert len(codes) > 800  # 910 on torch 2.13.0: the walk reached the packages
    resume = dis.opmap["RESUME"]
    for code in codes:
        marked = marks.marked_code(code, lambda: None)
        assert marked is not None, code.co_qualname
        at = next(i for i in range(0, len(code.co_code), 2) if code.co_code[i] == resume) + 2
        added = len(marked.co_code) - len(code.co_code)
        assert marked.co_code[:at] + marked.co_code[at + added :] == code.co_code, code.co_qualname
        positions = list(code.co_positions())
        spliced = positions[: at // 2] + [(None, None, None, None)] * (added // 2) + positions[at // 2 :]
        assert list(marked.co_positions()) == spliced, code.co_qualname

        expected = [_moved(e, at, added) for e in dis._parse_exception_table(code)]
        got = [(e.start, e.end, e.target, e.depth, e.lasti) for e in dis._parse_exception_table(marked)]
        assert got == expected, code.co_qualname


def test_a_marked_copy_of_an_entry_split_mid_way_keeps_its_location() -> None:
    """A one-line function whose ``RESUME`` shares a location entry with the body: the entry is split, both
    halves keep the location."""
    namespace: dict[str, object] = {}
    exec(compile("def f(x): return x", "<one-line>", "exec"), namespace)
    code = namespace["f"].__code__
    marked = marks.marked_code(code, lambda: None)
    assert marked is not None
    located = [p for p in marked.co_positions() if p[0] is not None]
    assert located == list(code.co_positions())
