"""What one backward did in guide 07's terms, observed from the code that ran (`checks.probes.calls`):

- every call of `_pre_backward_hook`, whatever it then does;
- the calls that get past its ``_ran_pre_backward_hook`` guard: the hook enters
  ``record_function("FullyShardedDataParallel._pre_backward_hook")`` on the line right after the guard, so a
  ``record_function.__enter__`` with that name, called from the hook's frame, marks the call as passed;
- ``FlatParamHandle.prepare_gradient_for_backward`` called from the hook: its per-handle work;
- ``_register_post_backward_final_callback`` and ``_post_backward_final_callback`` runs, with the root's
  ``_post_backward_callback_queued`` flag at each;
- ``queue_callback`` calls on autograd's engine (``Variable._execution_engine``), a C method that no trace
  function sees: a profile function (``sys.setprofile``) sees it as a ``c_call``. Backward runs on the calling
  thread for that (``set_multithreading_enabled(False)``, as the FSDP event recorder does on GPU).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from checks.probes import calls
from checks.ranks.codeswap import code_of
from checks.workloads.gpt import units

RU = "torch.distributed.fsdp._runtime_utils"
GUARD_PASSED = "FullyShardedDataParallel._pre_backward_hook"  # the record_function the hook enters after its guard


@dataclass
class HookCall:
    """One call of `_pre_backward_hook`: for which unit, whether it got past the guard, whether it prepared the
    handle's gradient."""

    unit: str
    passed: bool = False
    prepared: bool = False


@dataclass
class BackwardLog:
    calls: list[HookCall] = field(default_factory=list)
    registrations: list[dict[str, Any]] = field(default_factory=list)  # queued flag at entry and at return
    final_callbacks: list[bool | None] = field(default_factory=list)  # queued flag as each run starts
    queue_callbacks: int = 0

    def per_unit(self, attribute: str) -> dict[str, list[bool]]:
        out: dict[str, list[bool]] = {}
        for call in self.calls:
            out.setdefault(call.unit, []).append(getattr(call, attribute))
        return out


def _code(symbol: str) -> types.CodeType:
    return calls.function_code(symbol)


@contextmanager
def observe_backward(model: nn.Module) -> Iterator[BackwardLog]:
    """Record the pre-backward calls, the callback registrations and runs, and ``queue_callback`` calls."""
    from torch.distributed.fsdp import _runtime_utils

    log = BackwardLog()
    names = {id(unit): name for name, unit in units(model).items()}
    hook_code = _code(f"{RU}:_pre_backward_hook")
    open_calls: list[HookCall] = []

    def from_hook(frame: types.FrameType) -> bool:
        return bool(open_calls) and frame.f_back is not None and code_of(frame.f_back) is hook_code

    def on_hook(frame: types.FrameType) -> calls.ReturnHook:
        call = HookCall(names.get(id(frame.f_locals["state"]), "?"))
        log.calls.append(call)
        open_calls.append(call)
        return lambda frame, value: open_calls.pop()

    def on_record_function(frame: types.FrameType) -> None:
        if from_hook(frame) and frame.f_locals["self"].name == GUARD_PASSED:
            open_calls[-1].passed = True

    def on_prepare(frame: types.FrameType) -> None:
        if from_hook(frame):
            open_calls[-1].prepared = True

    def on_register(frame: types.FrameType) -> calls.ReturnHook:
        state = frame.f_locals["state"]
        entry = {"unit": names.get(id(state), "?"), "before": getattr(state, "_post_backward_callback_queued", None)}

        def done(frame: types.FrameType, value: Any) -> None:
            entry["after"] = getattr(state, "_post_backward_callback_queued", None)
            log.registrations.append(entry)

        return done

    def on_final(frame: types.FrameType) -> None:
        log.final_callbacks.append(getattr(frame.f_locals["state"], "_post_backward_callback_queued", None))

    engine = _runtime_utils.Variable._execution_engine
    previous = sys.getprofile()

    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        if previous is not None:
            previous(frame, event, arg)
        if event == "c_call" and getattr(arg, "__self__", None) is engine and arg.__name__ == "queue_callback":
            log.queue_callbacks += 1

    hooks = {
        hook_code: on_hook,
        _code("torch.autograd.profiler:record_function.__enter__"): on_record_function,
        _code("torch.distributed.fsdp._flat_param:FlatParamHandle.prepare_gradient_for_backward"): on_prepare,
        _code(f"{RU}:_register_post_backward_final_callback"): on_register,
        _code(f"{RU}:_post_backward_final_callback"): on_final,
    }
    with calls.subscribed(hooks) as subscription, torch.autograd.set_multithreading_enabled(False):
        sys.setprofile(profile)
        try:
            yield log
        finally:
            sys.setprofile(previous)
    if subscription.errors:
        raise RuntimeError(f"the pre-backward observer failed: {subscription.errors[0]!r}")
