"""Guide 17's break-it recipes: FSDP2's prefetch bent on purpose (`tests/break_it/test_17_fsdp2_prefetch.py` applies
them): a forward that prefetches as FSDP1 does, a backward prefetch of the wrong entry, explicit targets ignored or
cut to one, groups kept unsharded, a pending all-gather issued again; the post-forward order cleared from the wrong
place, at the wrong time or not at all; torch 2.15's manual finalization ignored or cut short; a final callback
queued by every state; a post-forward order without multiplicity; post-backwards that keep a group unsharded or run
once."""

from __future__ import annotations

from typing import Any


def prefetch_two_back(original: Any, self: Any) -> None:
    """``_backward_prefetch`` that prefetches the entry two before the group's own, not one. (The group is called
    ``self`` so that the event recorder names the issuer.)"""
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

    if self._training_state != TrainingState.PRE_BACKWARD or not self._post_forward_indices:
        return
    index = self._post_forward_indices.pop()
    if index > 1:
        self._prefetch_unshard(self.comm_ctx.post_forward_order[index - 2], "backward")


def forward_prefetch_like_fsdp1(original: Any, self: Any, module: Any, args: Any, kwargs: Any) -> Any:
    """``FSDPState._pre_forward`` that, after its own unshard, prefetches the next state's groups in module
    pre-order: an implicit forward prefetch, as FSDP1's ``forward_prefetch=True`` would issue (``self``: the
    state, so that the event recorder names the issuer)."""
    state = self
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    first = state._training_state not in (TrainingState.FORWARD, TrainingState.PRE_BACKWARD)
    result = original(state, module, args, kwargs)
    states = state._state_ctx.all_states
    if first and state in states and states.index(state) + 1 < len(states):
        for group in states[states.index(state) + 1]._fsdp_param_groups:
            FSDPParamGroup._prefetch_unshard(group, "forward")
    return result


def ignore_backward_targets(original: Any, state: Any, grad: Any) -> Any:
    """``FSDPState._pre_backward`` that ignores the explicit targets: every group takes the implicit path."""
    kept = state._states_to_backward_prefetch
    state._states_to_backward_prefetch = []
    try:
        return original(state, grad)
    finally:
        state._states_to_backward_prefetch = kept


def ignore_forward_targets(original: Any, state: Any, module: Any, args: Any, kwargs: Any) -> Any:
    """``FSDPState._pre_forward`` that ignores the explicit targets."""
    kept = state._states_to_forward_prefetch
    state._states_to_forward_prefetch = []
    try:
        return original(state, module, args, kwargs)
    finally:
        state._states_to_forward_prefetch = kept


def first_target_only(original: Any, module: Any, modules: list[Any]) -> None:
    """``set_modules_to_{forward,backward}_prefetch`` that keeps only the first module asked for (lookahead 1)."""
    return original(module, modules[:1])


def keep_unsharded_after_forward(original: Any, group: Any) -> None:
    """``FSDPParamGroup.reshard`` that does nothing in forward: every setting behaves as False."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

    if group._training_state == TrainingState.FORWARD:
        return None
    return original(group)


def regather_when_pending(original: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """``FSDPParamGroup.unshard`` that drops a pending all-gather and issues a new one, instead of absorbing the
    second request: every prefetched group is all-gathered twice."""
    self._all_gather_result = None
    return original(self, *args, **kwargs)


def implicit_prefetch_always(original: Any, self: Any, default_prefetch: bool, *unused: Any) -> None:
    """``FSDPParamGroup.pre_backward`` told to take the implicit path even when the unit has explicit targets."""
    return original(self, True, *unused)


def keep_order_across_steps(original: Any, self: Any) -> None:
    """``_root_post_backward_final_callback`` whose step end does not clear the post-forward order: the next
    forward appends to the old one."""
    kept = list(self._comm_ctx.post_forward_order)
    original(self)
    self._comm_ctx.post_forward_order[:0] = kept


def last_backward_always(original: Any, self: Any) -> None:
    """``_root_post_backward_final_callback`` that ignores ``set_is_last_backward(False)``: every backward ends the
    iteration, so a gradient-accumulation backward clears the post-forward order too."""
    kept = self._state_ctx.is_last_backward
    self._state_ctx.is_last_backward = True
    try:
        return original(self)
    finally:
        self._state_ctx.is_last_backward = kept


def callback_ignores_manual_mode(original: Any, self: Any) -> None:
    """``_root_post_backward_final_callback`` run as if manual finalization were off (torch >= 2.15): it ends the
    iteration itself, clearing the order and reducing the root's gradient before ``finalize_backward``."""
    kept = self._state_ctx.manual_backward_finalization_active
    self._state_ctx.manual_backward_finalization_active = False
    try:
        return original(self)
    finally:
        self._state_ctx.manual_backward_finalization_active = kept


def deferred_reductions_dropped(original: Any, self: Any) -> None:
    """``_root_post_backward_final_callback`` that forgets the post-backwards it deferred (torch >= 2.15, manual
    finalization): ``finalize_backward`` then never reduce-scatters the root's gradient."""
    original(self)
    for state in self._state_ctx.all_states:
        for group in state._fsdp_param_groups:
            group._post_backward_pending = False


def finalize_always_waits(original: Any, self: Any, *, wait_for_gradient_reduction: bool = True) -> None:
    """``FSDPState.finalize_backward`` that waits even when asked not to (torch >= 2.15): an asynchronous
    ``finalize_backward`` ends the iteration, and clears the order, before its handle is waited on."""
    return original(self, wait_for_gradient_reduction=True)


def forward_while_reduction_pending(original: Any, self: Any, module: Any, args: Any, kwargs: Any) -> Any:
    """``FSDPState._pre_forward`` without torch 2.15's guard: a forward runs while an asynchronous gradient
    reduction is still pending."""
    pending, active = self._state_ctx.gradient_reduction_pending, self._comm_ctx.active_gradient_reduction
    self._state_ctx.gradient_reduction_pending, self._comm_ctx.active_gradient_reduction = False, None
    try:
        return original(self, module, args, kwargs)
    finally:
        self._state_ctx.gradient_reduction_pending, self._comm_ctx.active_gradient_reduction = pending, active


def clear_before_finalize(original: Any, self: Any) -> None:
    """``_root_post_backward_final_callback`` that empties the post-forward order first, on a last backward, before
    any group's ``finalize_backward`` has run: the list is cleared from the wrong place and too early."""
    if self._state_ctx.is_last_backward and not getattr(self._state_ctx, "manual_backward_finalization_active", False):
        self._comm_ctx.post_forward_order.clear()
    return original(self)


def post_forward_mesh_ignored(original: Any, self: Any) -> None:
    """``FSDPParamGroup._to_sharded_post_forward`` resharding to the whole mesh instead: an int setting read as
    True."""
    self._to_sharded()


def callback_queued_every_time(original: Any, self: Any) -> None:
    """``_register_root_post_backward_final_callback`` that never finds the callback queued: every state's
    pre-backward queues its own, and the final callback runs once per state."""
    self._state_ctx.post_backward_final_callback_queued = False
    original(self)


def record_first_use_only(original: Any, self: Any) -> None:
    """``_record_post_forward`` without multiplicity: a group already in the post-forward order is not appended
    again, so a second forward adds no entries."""
    if self._post_forward_indices:
        return None
    return original(self)


def keep_unsharded_without_gradient(original: Any, self: Any, *unused: Any) -> None:
    """``FSDPParamGroup.post_backward`` that keeps the group unsharded when no parameter has a gradient yet (an
    earlier use of a group used twice), so the later use finds it unsharded and all-gathers nothing."""
    has_grad = any(
        hasattr(param, "_unsharded_param") and param.unsharded_param.grad is not None for param in self.fsdp_params
    )
    if has_grad:
        return original(self, *unused)
    kept, self.reshard_after_backward = self.reshard_after_backward, False
    try:
        return original(self, *unused)
    finally:
        self.reshard_after_backward = kept


def post_backward_once(original: Any, self: Any, *unused: Any) -> None:
    """``FSDPParamGroup.post_backward`` read as idempotent: a group's later calls, on the same model, return at
    once, so the use that holds the accumulated gradient never frees or reduce-scatters it."""
    done = self.comm_ctx.__dict__.setdefault("_break_it_post_backward_ran", set())
    if id(self) in done:
        return None
    done.add(id(self))
    return original(self, *unused)
