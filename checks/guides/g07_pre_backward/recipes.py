"""Guide 07's behaviour bent on purpose: the break-it recipes `tests/break_it/test_07_pre_backward.py` applies
(hooks on the wrong outputs, a guard that lets calls through, the final callback queued twice, never, or from
a child unit), and `EXERCISES`, some of them as puzzles (``fsdp-readings exercise 07-pre-backward``)."""

from __future__ import annotations

from typing import Any

import torch

from checks.breakit.exercises import Exercise
from checks.breakit.patches import wrapping

RU = "torch.distributed.fsdp._runtime_utils"


def hook_twice(original: Any, state: Any, module: Any, outputs: Any, handle: Any) -> Any:
    """``_register_pre_backward_hooks`` run twice on the same outputs: every tensor carries two hooks."""
    return original(state, module, original(state, module, outputs, handle), handle)


def hook_every_float_output(original: Any, state: Any, module: Any, outputs: Any, handle: Any) -> Any:
    """``_register_pre_backward_hooks`` that ignores ``requires_grad``: every floating-point output is made to
    require grad (torch refuses a hook on a tensor that does not) and gets the hook. Integer tensors cannot."""
    from torch.distributed.utils import _apply_to_tensors

    def force(t: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and not t.requires_grad and t.is_floating_point():
            t.requires_grad_(True)
        return t

    return original(state, module, _apply_to_tensors(force, outputs), handle)


def hook_first_output_only(original: Any, state: Any, module: Any, outputs: Any, handle: Any) -> Any:
    """``_register_pre_backward_hooks`` that hooks only the first element of a tuple of outputs."""
    if isinstance(outputs, tuple) and outputs:
        return (original(state, module, outputs[0], handle), *outputs[1:])
    return original(state, module, outputs, handle)


def mark_every_unit_for_unshard(original: Any, state: Any, module: Any, outputs: Any, handle: Any) -> Any:
    """``_register_pre_backward_hooks`` that marks the handle as needing a pre-backward unshard even when no
    output was hooked."""
    outputs = original(state, module, outputs, handle)
    if handle and torch.is_grad_enabled():
        handle._needs_pre_backward_unshard = True
    return outputs


def without_guard(original: Any, state: Any, module: Any, handle: Any, *args: Any) -> Any:
    """``_pre_backward_hook`` with its ``_ran_pre_backward_hook`` guard dropped: every call finds it False. The
    state check behind it then refuses the second call (``expected to be in states [IDLE]``)."""
    if handle:
        handle._ran_pre_backward_hook = False
    return original(state, module, handle, *args)


def without_guard_or_state_check(original: Any, state: Any, module: Any, handle: Any, *args: Any) -> Any:
    """``_pre_backward_hook`` with the guard dropped and the unit's training state put back to IDLE before every
    call, so the state check passes too and each call does the work again."""
    from torch.distributed.fsdp._common_utils import TrainingState

    if handle:
        handle._ran_pre_backward_hook = False
        state.training_state = TrainingState.IDLE
    return original(state, module, handle, *args)


def queue_twice(original: Any, state: Any, module: Any) -> None:
    """``_register_post_backward_final_callback`` that forgets it queued and queues a second time."""
    original(state, module)
    state._post_backward_callback_queued = False
    original(state, module)


def root_forgets_it_queued(
    original: Any, state: Any, module: Any, handle: Any, *args: Any, without_handle_only: bool = False
) -> Any:
    """``_pre_backward_hook`` with the root's ``_post_backward_callback_queued`` cleared before every call (only
    for a root without a handle, with ``without_handle_only``)."""
    if state._is_root and not (without_handle_only and handle):
        state._post_backward_callback_queued = False
    return original(state, module, handle, *args)


_ROOT: list[tuple[Any, Any]] = []  # (state, module) of the root whose hooks `remember_root` saw registered last


def remember_root(original: Any, state: Any, module: Any, outputs: Any, handle: Any) -> Any:
    """``_register_pre_backward_hooks`` unchanged, except that it remembers the root for `any_unit_queues`."""
    if state._is_root:
        _ROOT[:] = [(state, module)]
    return original(state, module, outputs, handle)


def any_unit_queues(original: Any, state: Any, module: Any, handle: Any, *args: Any) -> Any:
    """``_pre_backward_hook`` that queues the root's final callback from whichever unit's hook runs first."""
    from torch.distributed.fsdp import _runtime_utils

    if not state._is_root and _ROOT:
        root_state, root_module = _ROOT[0]
        if not root_state._post_backward_callback_queued:
            _runtime_utils._register_post_backward_final_callback(root_state, root_module)
    return original(state, module, handle, *args)


# -- exercises: recipes above as puzzles (fsdp-readings exercise 07-pre-backward) ------------------------------------
EXERCISES = (
    Exercise(
        "hook-every-output",
        claim="hooked-where-grad-is-required",
        patches=(wrapping(f"{RU}:_register_pre_backward_hooks", hook_every_float_output),),
        puzzle="Every floating-point output is made to require grad and gets the pre-backward hook.",
        reason="hooked-outputs",
    ),
    Exercise(
        "no-guard-no-state-check",
        claim="once-per-handle-per-backward",
        patches=(wrapping(f"{RU}:_pre_backward_hook", without_guard_or_state_check),),
        puzzle="Each call of `_pre_backward_hook` finds the guard open and its unit IDLE. Nothing raises.",
        reason="pre-backward-work",
    ),
    Exercise(
        "a-child-queues",
        claim="no-callback-without-root-output",
        patches=(
            wrapping(f"{RU}:_register_pre_backward_hooks", remember_root),
            wrapping(f"{RU}:_pre_backward_hook", any_unit_queues),
        ),
        puzzle="Whichever unit's pre-backward hook runs first queues the root's final callback, not only the root's.",
        reason="queue-callback-calls",
    ),
)
