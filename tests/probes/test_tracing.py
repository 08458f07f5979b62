"""The trace multiplexer that frame observers share, in this process; and how it sees a function that runtime
evidence (`checks.ranks.marks`) marked."""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import pytest

from checks.ranks import marks, tracing


def target(x: int) -> int:
    return x + 1


def other() -> int:
    return target(1)


CODE = target.__code__


@pytest.fixture(autouse=True)
def _restores_tracer() -> Iterator[None]:
    before = sys.gettrace()
    yield
    assert sys.gettrace() == before, "a subscription leaked a trace function"


def test_two_observers_share_one_trace_function_and_may_leave_in_any_order() -> None:
    calls: list[str] = []
    first = tracing.subscribe({CODE: lambda frame: calls.append("first")})
    tracer = sys.gettrace()
    second = tracing.subscribe({CODE: lambda frame: calls.append("second")})
    assert sys.gettrace() == tracer  # the second subscription did not install another function
    target(1)
    tracing.unsubscribe(first)  # not LIFO
    target(2)
    tracing.unsubscribe(second)
    target(3)
    assert calls == ["first", "second", "second"]


def test_return_hooks_see_the_return_value() -> None:
    returned: list[Any] = []

    def on_call(frame: types.FrameType) -> tracing.ReturnHook:
        assert frame.f_locals["x"] == 41
        return lambda frame, value: returned.append(value)

    with tracing.subscribed({CODE: on_call}):
        target(41)
    assert returned == [42]


def test_a_tracer_installed_before_keeps_running() -> None:
    """A debugger or coverage that traced before must go on seeing calls (and lines) while probes subscribe."""
    seen: list[tuple[str, str]] = []

    def previous(frame: types.FrameType, event: str, arg: Any) -> Any:
        if frame.f_code is CODE:
            seen.append(("previous", event))
            return local
        return None

    def local(frame: types.FrameType, event: str, arg: Any) -> Any:
        seen.append(("previous-local", event))
        return local

    outer = sys.gettrace()
    sys.settrace(previous)
    try:
        with tracing.subscribed({CODE: lambda frame: lambda f, v: seen.append(("probe", "return"))}):
            target(1)
        assert sys.gettrace() is previous
    finally:
        sys.settrace(outer)
    assert ("previous", "call") in seen and ("previous-local", "line") in seen and ("probe", "return") in seen
    assert ("previous-local", "return") in seen


def test_a_failing_hook_does_not_break_the_traced_code() -> None:
    calls = 0

    def broken(frame: types.FrameType) -> None:
        nonlocal calls
        calls += 1
        raise ValueError("observer bug")

    with tracing.subscribed({CODE: broken}) as subscription:
        assert target(1) == 2 and target(2) == 3
    assert calls == 1 and subscription.broken
    assert isinstance(subscription.errors[0], ValueError)


def test_threads_started_inside_are_traced() -> None:
    seen: list[str] = []
    with tracing.subscribed({CODE: lambda frame: seen.append(threading.current_thread().name)}):
        worker = threading.Thread(target=target, args=(1,), name="worker")
        worker.start()
        worker.join()
    assert seen == ["worker"]
    assert threading.gettrace() is None


def test_a_frame_running_a_marked_copy_reaches_the_hooks_of_the_original() -> None:
    """Runtime evidence runs a function's first call through a marked copy of its code: a hook on the function's
    own code still sees that call, whether it was subscribed before the mark or with the copy's code."""
    calls: list[str] = []
    symbol = f"{__name__}:target"
    # The subscription's code is read once the watch has begun: the marked copy.
    with marks.watch((symbol,)), tracing.subscribed({target.__code__: lambda frame: calls.append("marked copy")}):
        target(1)
    with tracing.subscribed({CODE: lambda frame: calls.append("original")}), marks.watch((symbol,)):
        target(1)
        target(2)
    assert calls == ["marked copy", "original", "original"]
