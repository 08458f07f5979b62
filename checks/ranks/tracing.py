"""The one global trace function that every frame observer in a rank shares.

``sys.settrace`` holds a single function per thread: two observers that each install their own (a check's
call-site recorder, runtime evidence on an interpreter `checks.ranks.marks` cannot mark) would silently switch
each other off. So the trace function is a multiplexer: observers `subscribe` a table ``{code object: call
hook}``; on every new Python frame the multiplexer does one dictionary lookup and calls the hooks of that code
object, if any. A hook may ask for the frame's return (to read what the call changed); only those frames get a
local tracer, with line events switched off, so the cost elsewhere stays one lookup per call. A trace function
that was installed before (a debugger, coverage) keeps running: the multiplexer chains to it.

Threads started while a subscription is active are traced too (``threading.settrace``). Autograd's own device
threads (CUDA backward) are C++ threads that never see ``sys.settrace``: on GPU, code that runs only inside
backward hooks can go unseen unless backward runs on the calling thread
(``torch.autograd.set_multithreading_enabled(False)``, which the FSDP event recorder does). On CPU, backward hooks
run on the calling thread and are seen.

Hooks are keyed by a function's own code: a frame running the marked copy that runtime evidence installs until a
function's first call (`checks.ranks.marks`) is looked up as the original.

A hook that raises does not break the traced code: the exception is kept on its `Subscription` (``errors``) for
the observer to report, and the hook is not called again.
"""

from __future__ import annotations

import itertools
import sys
import threading
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from checks.ranks import codeswap

ReturnHook = Callable[[types.FrameType, Any], None]  # (frame, return value or None when unwinding)
CallHook = Callable[[types.FrameType], ReturnHook | None]
_TraceFn = Callable[[types.FrameType, str, Any], Any]


@dataclass
class Subscription:
    hooks: Mapping[types.CodeType, CallHook]
    token: int
    errors: list[BaseException] = field(default_factory=list)
    broken: bool = False


class _LocalTracer:
    """Per-frame tracer for frames whose return a hook asked for; forwards events to a chained local tracer."""

    __slots__ = ("chained", "on_return")

    def __init__(self, on_return: list[tuple[Subscription, ReturnHook]], chained: _TraceFn | None) -> None:
        self.on_return = on_return
        self.chained = chained

    def __call__(self, frame: types.FrameType, event: str, arg: Any) -> _LocalTracer:
        if self.chained is not None:
            self.chained = self.chained(frame, event, arg)
        if event == "return":
            for subscription, hook in self.on_return:
                call_safely(subscription, hook, frame, arg)
        return self


class _Multiplexer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscriptions: dict[int, Subscription] = {}
        self._table: dict[types.CodeType, tuple[tuple[Subscription, CallHook], ...]] = {}
        self._tokens = itertools.count()
        self._previous: dict[int, _TraceFn | None] = {}  # thread ident -> trace function found at install
        self._previous_threading: _TraceFn | None = None

    @property
    def active(self) -> bool:
        return bool(self._subscriptions)

    def subscribe(self, hooks: Mapping[types.CodeType, CallHook]) -> Subscription:
        with self._lock:
            subscription = Subscription(dict(hooks), next(self._tokens))
            first = not self._subscriptions
            self._subscriptions[subscription.token] = subscription
            self._rebuild()
            if first:
                self._previous_threading = threading.gettrace()
                threading.settrace(self._on_call)
            self._install_here()
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            if self._subscriptions.pop(subscription.token, None) is None:
                return
            self._rebuild()
            if not self._subscriptions:
                sys.settrace(self._previous.pop(threading.get_ident(), None))
                threading.settrace(self._previous_threading)  # type: ignore[arg-type]
                self._previous.clear()
                self._previous_threading = None

    def _install_here(self) -> None:
        current = sys.gettrace()
        if current != self._on_call:  # bound methods are new objects on every access: compare, not ``is``
            self._previous[threading.get_ident()] = current
            sys.settrace(self._on_call)

    def _rebuild(self) -> None:
        table: dict[types.CodeType, list[tuple[Subscription, CallHook]]] = {}
        for subscription in self._subscriptions.values():
            for code, hook in subscription.hooks.items():
                table.setdefault(codeswap.original(code), []).append((subscription, hook))
        self._table = {code: tuple(hooks) for code, hooks in table.items()}  # swapped whole: readers never lock

    def _on_call(self, frame: types.FrameType, event: str, arg: Any) -> _TraceFn | None:
        previous = self._previous.get(threading.get_ident(), self._previous_threading)
        chained = previous(frame, event, arg) if previous is not None else None
        hooks = self._table.get(codeswap.code_of(frame))
        if hooks is None:
            return chained
        on_return: list[tuple[Subscription, ReturnHook]] = []
        for subscription, hook in hooks:
            returned = call_safely(subscription, hook, frame)
            if returned is not None:
                on_return.append((subscription, returned))
        if not on_return:
            return chained
        if chained is None:
            frame.f_trace_lines = False  # only 'return' (and 'exception') events reach the local tracer
        return _LocalTracer(on_return, chained)


def call_safely(subscription: Any, hook: Callable[..., Any], *args: Any) -> Any:
    """Run an observer's hook; a hook that raises is kept on ``subscription.errors`` and not called again (any
    subscription with ``errors`` and ``broken``: this module's, or `checks.probes.calls`')."""
    if subscription.broken:
        return None
    try:
        return hook(*args)
    except BaseException as exc:  # an observer's bug must not change what the observed code does
        subscription.errors.append(exc)
        subscription.broken = True
        return None


_MULTIPLEXER = _Multiplexer()


def subscribe(hooks: Mapping[types.CodeType, CallHook]) -> Subscription:
    """Call ``hooks[frame.f_code](frame)`` on every new frame of those code objects until `unsubscribe`."""
    return _MULTIPLEXER.subscribe(hooks)


def unsubscribe(subscription: Subscription) -> None:
    _MULTIPLEXER.unsubscribe(subscription)


@contextmanager
def subscribed(hooks: Mapping[types.CodeType, CallHook]) -> Iterator[Subscription]:
    subscription = subscribe(hooks)
    try:
        yield subscription
    finally:
        unsubscribe(subscription)
