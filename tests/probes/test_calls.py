"""The call observer under the FSDP event recorder (`checks.probes.calls`), in-process: a swapped function behaves as
before for its callers (arguments, defaults, closures, exceptions), hooks see its arguments and real caller, and
everything is restored when the last subscription ends; no trace function is ever installed."""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from checks.probes import calls


def signature_zoo(a, b=2, /, c=3, *args, d, e=5, **kwargs):
    return (a, b, c, args, d, e, kwargs)


def _closure() -> Any:
    offset = 10

    def add(x):
        return x + offset

    return add


with_closure = _closure()


def raises(x):
    raise ValueError(x)


@pytest.fixture
def module() -> Iterator[str]:
    """The functions above as a module the observer resolves ``"module:name"`` symbols in."""
    name = "probes_calls_fixture"
    fake = types.ModuleType(name)
    fake.signature_zoo, fake.with_closure, fake.raises = signature_zoo, with_closure, raises
    sys.modules[name] = fake
    yield name
    del sys.modules[name]


def test_swapped_functions_behave_as_before_and_hooks_see_calls(module: str) -> None:
    seen: list[Any] = []

    def hook(frame: types.FrameType) -> calls.ReturnHook:
        seen.append((frame.f_code.co_name, dict(frame.f_locals), frame.f_back.f_code.co_name))
        return lambda frame, value: seen.append(("return", value))

    codes = {calls.function_code(f"{module}:{name}"): hook for name in ("signature_zoo", "with_closure", "raises")}
    held = functools.partial(signature_zoo, 1)  # as FSDP1 holds its hooks: the function object, bound early
    expected = (1, 2, 3, (), 4, 5, {})
    with calls.subscribed(codes) as subscription:
        assert sys.gettrace() is None
        assert held(d=4) == expected
        assert signature_zoo(1, 9, 8, 7, d=6, z=0) == (1, 9, 8, (7,), 6, 5, {"z": 0})
        assert with_closure(5) == 15
        with pytest.raises(ValueError, match="boom"):
            raises("boom")
        with pytest.raises(TypeError):
            signature_zoo()  # the same errors for a wrong call
    assert not subscription.errors
    caller = sys._getframe().f_code.co_name
    assert seen[0] == ("signature_zoo", {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "args": (), "kwargs": {}}, caller)
    assert seen[1] == ("return", expected)
    assert ("add", {"x": 5, "offset": 10}, caller) in seen and ("return", 15) in seen
    assert ("return", None) in seen  # the call that raised
    assert signature_zoo.__code__ in codes and with_closure.__code__ in codes  # restored
    assert "__fsdp_readings_calls__" not in signature_zoo.__globals__


def test_subscriptions_nest_and_a_failing_hook_is_reported_not_raised(module: str) -> None:
    code = calls.function_code(f"{module}:with_closure")
    outer: list[int] = []

    def broken(frame: types.FrameType) -> None:
        raise RuntimeError("hook bug")

    with calls.subscribed({code: lambda frame: outer.append(frame.f_locals["x"])}):
        with calls.subscribed({code: broken}) as inner:
            assert with_closure(1) == 11
            assert calls.function_code(f"{module}:with_closure") is code  # the original, while swapped
        assert with_closure(2) == 12
    assert with_closure(3) == 13
    assert outer == [1, 2] and isinstance(inner.errors[0], RuntimeError)
    assert with_closure.__code__ is code


def test_trampoline_frames_are_plumbing(module: str) -> None:
    frames: list[types.FrameType] = []
    code = calls.function_code(f"{module}:with_closure")
    with calls.subscribed({code: frames.append}):
        with_closure(0)
    assert calls.is_plumbing(frames[0]) and not calls.is_plumbing(sys._getframe())
