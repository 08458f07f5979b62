"""Guide 11's break-it recipes (tests/break_it/test_11_final_callback_and_hybrid_shard.py applies them): the final
callback, the catch-all, the execution record and finalization bent on purpose."""

from __future__ import annotations

from typing import Any


def final_callback_keeping_hook_flags(original: Any, state: Any, module: Any) -> None:
    """The final callback, after which every handle still says its pre-backward hook ran."""
    original(state, module)
    for unit in state._all_fsdp_states:
        if unit._handle:
            unit._handle._ran_pre_backward_hook = True


def final_callback_left_queued(original: Any, state: Any, module: Any) -> None:
    """The final callback without its last line: the root still believes a callback is queued."""
    original(state, module)
    state._post_backward_callback_queued = True


def final_callback_resetting_first(original: Any, state: Any, module: Any) -> None:
    """Resets done before the callback runs instead of by it (wrong timing: the callback then finds them done)."""
    for unit in state._all_fsdp_states:
        unit.training_state = type(unit.training_state).IDLE
        if unit._handle:
            handle = unit._handle
            handle._training_state = type(handle._training_state).IDLE
            handle._ran_pre_backward_hook = False
            handle._post_forward_index = None
    original(state, module)


def catch_all_without_free(original: Any, state: Any) -> None:
    """`_catch_all_reshard` that points the flat parameter back at its shard but keeps the unsharded storage."""
    from torch.distributed.fsdp import _runtime_utils

    real = _runtime_utils._should_free_in_backward
    _runtime_utils._should_free_in_backward = lambda *args: False
    try:
        original(state)
    finally:
        _runtime_utils._should_free_in_backward = real


def pre_backward_then_free(original: Any, state: Any, module: Any, handle: Any, grad: Any, *unused: Any) -> Any:
    """`_pre_backward_hook` that frees a non-root unit's parameters right after unsharding them: the catch-all
    later finds it resharded (a reshard at the wrong time, in the hook instead of the callback)."""
    from torch.distributed.fsdp import _runtime_utils

    out = original(state, module, handle, grad, *unused)
    if handle and not state._is_root:
        _runtime_utils._reshard(state, handle, True)
    return out


def next_iter_without_clear(original: Any, self: Any) -> None:
    """`_ExecOrderData.next_iter` that keeps the post-forward order."""
    kept = list(self.handles_post_forward_order)
    original(self)
    self.handles_post_forward_order.extend(kept)


def next_iter_without_count(original: Any, self: Any) -> None:
    """`_ExecOrderData.next_iter` that does not count the iteration."""
    original(self)
    self._iter -= 1


def next_iter_clearing_pre_forward(original: Any, self: Any) -> None:
    """`_ExecOrderData.next_iter` that also forgets the pre-forward order."""
    original(self)
    self.handles_pre_forward_order.clear()


def finalize_copying_grad(original: Any, self: Any) -> None:
    """`prepare_gradient_for_optim` that hands the optimizer a copy of the sharded gradient."""
    original(self)
    flat = self.flat_param
    if flat.grad is not None:
        flat.grad = flat.grad.clone()


def finalize_keeping_called(original: Any, state: Any) -> None:
    """`_finalize_params` that leaves ``_post_backward_called`` True."""
    original(state)
    if state._handle and state._handle.flat_param.requires_grad:
        state._handle.flat_param._post_backward_called = True
