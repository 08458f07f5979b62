"""Observe calls of chosen Python functions without a trace function: ``with subscribed({code: hook}): ...``.

A trace function (``sys.settrace``, what `checks.ranks.tracing` multiplexes) puts CPython 3.11 in tracing mode for
*every* frame: each instruction goes through the tracing path and every call pays a Python callback, about 1.5× on a
mini_gpt FSDP step even when no frame is of interest. The FSDP event recorder only needs a dozen functions, so it
swaps their ``__code__`` instead: while a subscription is open, each observed function runs a trampoline with the
same signature, which calls the hooks with its own frame (the function's arguments in ``f_locals``, the real
caller in ``f_back``) and then the function's original code as a separate function object. Every other frame runs
untouched, and the swap reaches every caller: FSDP1's ``functools.partial`` hooks hold the function object, whose
code is what changes; threads (autograd's) run the trampoline too.

What hooks see is what a trace function's ``call`` event gave them (the frame at entry, with its arguments), and a
hook may return a return hook, called with (that frame, the return value or None when the call raised). The
original code still runs under its own code object, so ``frame.f_code is ...`` tests keep working. Runtime
evidence (`checks.ranks.marks`) may watch the same function: both set their layer on its
`checks.ranks.codeswap.Slot`, and the trampoline fires a pending mark. Frames of this module and the trampolines
sit between an observed function and its callers: `is_plumbing` names them so that stack walks can skip them.

Limits: functions only (no generators or coroutines), and a function's closure must be rebuilt with the same free
variables (checked; a mismatch raises). Rank-local: one process, swapped while at least one subscription is open.
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from checks.ranks import codeswap
from checks.ranks.symbols import resolve
from checks.ranks.tracing import CallHook, ReturnHook, call_safely

_ENTRY = "__fsdp_readings_calls__"  # the name trampolines call, set in the observed functions' globals while swapped
_NOT_PLAIN = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


@dataclass
class Subscription:
    hooks: Mapping[types.CodeType, CallHook]
    errors: list[BaseException] = field(default_factory=list)
    broken: bool = False


@dataclass
class _Swap:
    slot: codeswap.Slot
    body: types.FunctionType  # the original code as its own function: what the trampoline runs
    trampoline: types.CodeType
    subscriptions: list[Subscription] = field(default_factory=list)

    @property
    def original(self) -> types.CodeType:
        return self.slot.original


_functions: dict[types.CodeType, types.FunctionType] = {}  # original code -> the function that runs it
# Built once per observed function and process (compiling a trampoline costs more than a short block it observes);
# installed while it has subscriptions. A swap's index in `_swaps` is the key its trampoline passes.
_swaps: list[_Swap] = []
_by_code: dict[types.CodeType, _Swap] = {}  # original code -> its swap
_trampolines: dict[types.CodeType, _Swap] = {}  # trampoline code -> its swap


def function_code(symbol: str) -> types.CodeType:
    """The code object of the function ``symbol`` names (decorators unwrapped), its original one even while
    swapped, remembered so that `subscribe` can find the function again."""
    _, value, _ = resolve(symbol)
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    function = inspect.unwrap(value)
    if not isinstance(function, types.FunctionType):
        raise TypeError(f"{symbol} is not a Python function ({type(function).__name__})")
    swap = _trampolines.get(function.__code__)
    if swap is not None:
        return swap.original
    code = codeswap.original(function.__code__)  # not a copy that runtime evidence marked
    _functions[code] = function
    return code


def is_plumbing(frame: types.FrameType) -> bool:
    """A frame of this machinery (a trampoline, or this module's), never an observed function or its caller."""
    return frame.f_code in _trampolines or frame.f_globals.get("__name__") == __name__


def subscribe(hooks: Mapping[types.CodeType, CallHook]) -> Subscription:
    """Call ``hooks[code](frame)`` on every call of those functions (codes from `function_code`) until
    `unsubscribe`."""
    subscription = Subscription(dict(hooks))
    for code in subscription.hooks:
        swap = _by_code.get(code) or _build(code)
        if not swap.subscriptions:
            if codeswap.original(swap.slot.function.__code__) is not code:
                raise RuntimeError(f"{code.co_qualname}: its function's code was changed by someone else")
            swap.slot.function.__globals__[_ENTRY] = _enter
            swap.slot.trampoline = swap.trampoline
            swap.slot.install()
        swap.subscriptions.append(subscription)
    return subscription


def unsubscribe(subscription: Subscription) -> None:
    for code in subscription.hooks:
        swap = _by_code.get(code)
        if swap is None or subscription not in swap.subscriptions:
            continue
        swap.subscriptions.remove(subscription)
        if not swap.subscriptions:
            swap.slot.trampoline = None
            swap.slot.install()
    if not any(swap.subscriptions for swap in _swaps):  # torch's module namespaces as they were
        for swap in _swaps:
            swap.slot.function.__globals__.pop(_ENTRY, None)


@contextmanager
def subscribed(hooks: Mapping[types.CodeType, CallHook]) -> Iterator[Subscription]:
    subscription = subscribe(hooks)
    try:
        yield subscription
    finally:
        unsubscribe(subscription)


def _build(code: types.CodeType) -> _Swap:
    function = _functions.get(code)
    if function is None or codeswap.original(function.__code__) is not code:
        raise RuntimeError(f"{code.co_qualname} was not resolved with function_code, or its code changed since")
    if code.co_flags & _NOT_PLAIN:
        raise TypeError(f"{code.co_qualname}: only plain functions can be observed, not generators or coroutines")
    trampoline = _trampoline(code, len(_swaps))
    body = types.FunctionType(
        code, function.__globals__, function.__name__, function.__defaults__, function.__closure__
    )
    body.__kwdefaults__ = function.__kwdefaults__
    body.__qualname__ = function.__qualname__
    swap = _Swap(codeswap.slot_of(function), body, trampoline)
    _swaps.append(swap)
    _by_code[code] = swap
    _trampolines[trampoline] = swap
    return swap


def _trampoline(code: types.CodeType, key: int) -> types.CodeType:
    """A code object with ``code``'s signature and free variables that hands its call to `_enter`."""
    names = code.co_varnames
    positional = code.co_argcount
    keyword_only = code.co_kwonlyargcount
    params = list(names[:positional])
    if code.co_posonlyargcount:
        params.insert(code.co_posonlyargcount, "/")
    call = list(names[:positional])
    index = positional + keyword_only
    if code.co_flags & inspect.CO_VARARGS:
        params.append(f"*{names[index]}")
        call.append(f"*{names[index]}")
        index += 1
    elif keyword_only:
        params.append("*")
    params += names[positional : positional + keyword_only]
    call += [f"{k}={k}" for k in names[positional : positional + keyword_only]]
    if code.co_flags & inspect.CO_VARKEYWORDS:
        params.append(f"**{names[index]}")
        call.append(f"**{names[index]}")
    free = code.co_freevars
    source = (
        "def __outer__():\n"
        + "".join(f"    {name} = None\n" for name in free)
        + f"    def {code.co_name}({', '.join(params)}):\n"
        + (f"        ({', '.join(free)},)\n" if free else "")  # keep them free variables, in the same order
        + f"        return {_ENTRY}({key})({', '.join(call)})\n"
        + f"    return {code.co_name}\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, code.co_filename, "exec"), namespace)
    inner = namespace["__outer__"]().__code__
    if inner.co_freevars != free:
        raise RuntimeError(f"cannot rebuild the free variables {free} of {code.co_qualname} (got {inner.co_freevars})")
    return inner.replace(co_firstlineno=code.co_firstlineno, co_qualname=code.co_qualname, co_name=code.co_name)


def _enter(key: int) -> Callable[..., Any]:
    """Called by a trampoline: run the hooks with its frame and return what it must call with its arguments."""
    swap = _swaps[key]
    frame = sys._getframe(1)
    if swap.slot.fire is not None:  # runtime evidence waits for this function's first call
        swap.slot.fire()
    returns: list[tuple[Subscription, ReturnHook]] = []
    for subscription in swap.subscriptions:
        hook = subscription.hooks[swap.original]
        returned = call_safely(subscription, hook, frame)
        if returned is not None:
            returns.append((subscription, returned))
    if not returns:
        return swap.body
    return _Returning(swap.body, frame, returns)


class _Returning:
    __slots__ = ("body", "frame", "returns")

    def __init__(self, body: Callable[..., Any], frame: types.FrameType, returns: list[tuple[Subscription, Any]]):
        self.body, self.frame, self.returns = body, frame, returns

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        value = None
        try:
            value = self.body(*args, **kwargs)
            return value
        finally:
            for subscription, hook in self.returns:
                call_safely(subscription, hook, self.frame, value)
