"""Sabotage recipes for break-it tests: the torch behaviour a claim asserts, bent on purpose.

Each function here is a ``wrapper`` for `checks.sabotage.wrapped_by` (called as ``wrapper(original, *args,
**kwargs)``) or a plain replacement. A break-it test names one in a `checks.protocol.Patch`; the ranks apply it
for one check and undo it afterwards.
"""

from __future__ import annotations

from typing import Any

import torch

from checks.protocol import Patch


def wrapping(target: str, wrapper: str, **params: Any) -> Patch:
    """A `Patch` that wraps the torch attribute ``target`` with this module's function ``wrapper``."""
    return Patch(target, "checks.sabotage:wrapped_by", {"wrapper": f"checks.breakers:{wrapper}", **params})


def shard_then_size_eagerly(original: Any, handle: Any, *args: Any, **kwargs: Any) -> Any:
    """``FlatParamHandle.shard`` that also sets ``_padded_unsharded_size`` at construction, as an eager
    implementation would."""
    result = original(handle, *args, **kwargs)
    flat_param = handle.flat_param
    flat_param._padded_unsharded_size = torch.Size([flat_param.numel() * handle.world_size])
    return result


def share_but_forget_roles(original: Any, root_state: Any, root_module: Any) -> None:
    """Share state as usual, then leave the non-roots' ``_is_root`` undecided, so each decides for itself."""
    original(root_state, root_module)
    for state in root_state._all_fsdp_states:
        if state is not root_state:
            state._is_root = None


def share_copies_not_objects(original: Any, root_state: Any, root_module: Any) -> None:
    """Share state as usual, then give each non-root an equal copy of the root's execution-order record and
    free-event queue instead of the object itself."""
    import copy

    original(root_state, root_module)
    for state in root_state._all_fsdp_states:
        if state is not root_state:
            state._exec_order_data = copy.copy(root_state._exec_order_data)
            state._free_event_queue = copy.copy(root_state._free_event_queue)


def reshard_twice_on_rank_1(original: Any, state: Any, handle: Any) -> None:
    """``_post_forward_reshard`` that, on rank 1 only, first keeps and then frees: the ranks' event sequences
    differ while their collectives still match (a divergence that changes collectives would deadlock instead)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import _runtime_utils

    if handle and dist.get_rank() == 1:
        _runtime_utils._reshard(state, handle, False)
    original(state, handle)


def forward_registering_hooks(original: Any, module: Any, *args: Any, keep: bool = False, **kwargs: Any) -> Any:
    """``FullyShardedDataParallel.forward`` that first calls the composable-path helper
    ``_register_pre_forward_hook`` (and removes the hook again unless ``keep``)."""
    from torch.distributed.fsdp import _runtime_utils

    _runtime_utils._register_pre_forward_hook(module, module)
    if not keep:
        for handle in module._pre_forward_handles:
            handle.remove()
        module._pre_forward_handles.clear()
    return original(module, *args, **kwargs)


def finalize_keeping_hook_state(original: Any, state: Any) -> None:
    """``_finalize_params`` that removes the hook but leaves ``_post_backward_hook_state`` behind."""
    handle = state._handle
    kept = getattr(handle.flat_param, "_post_backward_hook_state", None) if handle else None
    original(state)
    if kept is not None:
        handle.flat_param._post_backward_hook_state = kept


def reshard_everything(original: Any, state: Any, handle: Any) -> None:
    """``_post_forward_reshard`` that frees every unit, the root included."""
    from torch.distributed.fsdp import _runtime_utils

    if handle:
        _runtime_utils._reshard(state, handle, True)


def every_sharded_strategy(original: Any) -> tuple[Any, ...]:
    """A RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES that also frees SHARD_GRAD_OP units after forward."""
    from torch.distributed.fsdp._flat_param import HandleShardingStrategy

    return (*original, HandleShardingStrategy.SHARD_GRAD_OP)


def all_gather_twice(original: Any, handle: Any, padded_unsharded_flat_param: Any) -> Any:
    """``FlatParamHandle._all_gather_flat_param`` that gathers the same shard twice."""
    original(handle, padded_unsharded_flat_param)
    return original(handle, padded_unsharded_flat_param)


def reshard_keeping_prefetched(original: Any, state: Any, handle: Any, free_unsharded_flat_param: bool) -> None:
    """``_reshard`` that restores the handle's ``_prefetched`` flag afterwards (the pre-2.2 behaviour, roughly)."""
    prefetched = handle._prefetched
    original(state, handle, free_unsharded_flat_param)
    handle._prefetched = prefetched


def forward_target_by_module_order(original: Any, eod: Any, current_handle: Any) -> Any:
    """``get_handle_to_forward_prefetch`` that falls back to the next handle in module order when the recorded
    order has none: a policy that could prefetch in iteration 1."""
    found = original(eod, current_handle)
    if found is None and current_handle._handle_index is not None:
        following = eod.all_handles[current_handle._handle_index + 1 :]
        return following[0] if following else None
    return found


def next_iter_forgetting_order(original: Any, eod: Any) -> None:
    """``next_iter`` that also forgets the recorded pre-forward order, so every iteration records afresh."""
    original(eod)
    for handle in eod.handles_pre_forward_order:
        handle._pre_forward_order_index = None
    eod.handles_pre_forward_order.clear()
    eod._iter = 0


def prefetch_two_ahead(original: Any, eod: Any, current_handle: Any) -> Any:
    """``get_handle_to_forward_prefetch`` with a limit of 2: the unit after next."""
    eod._forward_prefetch_limit = 2
    try:
        return original(eod, current_handle)
    finally:
        eod._forward_prefetch_limit = 1


def root_input_uncast(original: Any, state: Any, module: Any, args: Any, kwargs: Any) -> tuple[Any, Any]:
    """``_root_cast_forward_input`` that leaves the inputs as they are."""
    return args, kwargs


def align_in_fp32(original: Any, unsharded_dtype: Any) -> int:
    """``_get_aligned_numel`` that always counts the 16 bytes in fp32 elements."""
    import torch

    return original(torch.float32)


def gather_then_scale(original: Any, handle: Any, padded_unsharded_flat_param: Any) -> Any:
    """``FlatParamHandle._all_gather_flat_param`` whose low-precision results are off by a factor 1 + 2^-5 (a
    lossy low-precision path; full-precision all-gathers are left alone)."""
    import torch

    out = original(handle, padded_unsharded_flat_param)
    if out.dtype != torch.float32:
        out.mul_(1 + 2**-5)
    return out


def buffers_all_in_root_dtype(original: Any, state: Any, root_module: Any) -> tuple[Any, Any]:
    """``_get_buffers_and_dtypes_for_computation`` where the root's buffer_dtype wins over each owner's."""
    buffers, _ = original(state, root_module)
    return buffers, [state.mixed_precision.buffer_dtype] * len(buffers)


def dequeue_at_one(original: Any, queue: Any) -> Any:
    """``_FreeEventQueue.dequeue_if_needed`` with a threshold of one pending free instead of two."""
    return queue._dequeue() if queue._queue else None


def unshard_consulting_the_queue(original: Any, state: Any, handle: Any, *args: Any) -> None:
    """``_unshard`` that asks the free-event queue even when limit_all_gathers is off."""
    if handle and not state.limit_all_gathers:
        state._free_event_queue.dequeue_if_needed()
    original(state, handle, *args)
