"""Guide 10's break-it recipes (tests/break_it/test_10_no_sync_and_frozen_params.py applies them): ``no_sync`` and
the reshard of frozen units bent on purpose."""

from __future__ import annotations

from typing import Any


def reduce_anyway(original: Any, state: Any, handle: Any, *args: Any) -> Any:
    """``_post_backward_hook`` that synchronises even inside ``no_sync`` (as if the flag were never cleared)."""
    sync = state._sync_gradients
    state._sync_gradients = True
    try:
        return original(state, handle, *args)
    finally:
        state._sync_gradients = sync


def forget_unsharded_grad(original: Any, handle: Any) -> None:
    """``FlatParamHandle.prepare_gradient_for_backward`` that drops a gradient kept from a no_sync backward."""
    flat_param = handle.flat_param
    if flat_param.grad is not None and flat_param.grad.size() == flat_param._unpadded_unsharded_size:
        flat_param.grad = None
    original(handle)


def hold_reshard_only(original: Any, state: Any, handle: Any, *args: Any) -> None:
    """``_post_backward_reshard_only_hook`` that does nothing: the frozen unit is left to the catch-all."""


def catch_all_freeing_silently(original: Any, state: Any) -> None:
    """``_catch_all_reshard`` that also frees any unsharded storage still allocated, without going through
    ``_reshard`` (so no event records it): only the bytes held show it."""
    original(state)
    handle = state._handle
    if handle and handle.uses_sharded_strategy and not handle.needs_unshard():
        handle._free_unsharded_flat_param()


def frozen_gets_grad_views(original: Any, handle: Any) -> None:
    """``FlatParamHandle._use_sharded_grad_views`` that gives frozen parameters a view of their gradient too."""
    original(handle)
    flat, grad = handle.flat_param, handle.sharded_grad
    if grad is None:
        return
    for param, info in zip(flat._params, flat._shard_param_infos, strict=True):
        if info.in_shard and not param.requires_grad:
            param.grad = grad[info.offset_in_shard : info.offset_in_shard + info.numel_in_shard].reshape(param.shape)


def zero_frozen_gradients(original: Any, state: Any, handle: Any) -> None:
    """``_reduce_grad`` that zeroes the frozen parameters' elements of the unsharded flat gradient first, as if FSDP
    skipped a gradient nobody reads."""
    flat, offset, index = handle.flat_param, 0, 0
    for numel, is_padding in zip(flat._numels_with_padding, flat._is_padding_mask, strict=True):
        if not is_padding:
            if not flat._params[index].requires_grad:
                flat.grad[offset : offset + numel].zero_()
            index += 1
        offset += numel
    original(state, handle)


def ddp_no_sync_syncs_anyway(original: Any, self: Any) -> Any:
    """`DistributedDataParallel.no_sync` that leaves ``require_backward_grad_sync`` alone: every step all-reduces."""
    from contextlib import nullcontext

    return nullcontext()
