"""Guide 12's break-it recipes: the flat parameter's construction, sharding, views, all-gather and reduction bent
on purpose, summon_full_params' writeback and rank0_only changed, and CPU offload's failures removed or added
(`tests/break_it/test_12_flat_parameter.py` applies them)."""

from __future__ import annotations

from typing import Any

import torch


def to_cpu_as_in_2_14_1(original: Any) -> Any:
    """``FlatParamHandle.to_cpu`` as torch 2.14.1 writes it: the same preconditions, then nothing at all when the
    flat parameter is already on the CPU (2.13.0's body otherwise)."""
    import contextlib

    from torch.distributed.fsdp._flat_param import _same_storage

    @contextlib.contextmanager
    def to_cpu(self: Any) -> Any:
        self._check_sharded_strategy()
        assert self.flat_param.size() == self.flat_param._unpadded_unsharded_size
        self._check_on_compute_device(self.flat_param)
        assert _same_storage(self.flat_param, self._get_padded_unsharded_flat_param())
        if self.flat_param.device.type == "cpu":
            yield
            return
        with original(self):
            yield

    return to_cpu


def aligned_off_by_one(original: Any, *args: Any, **kwargs: Any) -> int:
    """`_get_aligned_numel` one element off: fp32 aligns to 5 elements, bf16 to 9."""
    return original(*args, **kwargs) + 1


def shard_offsets_off_by_one(original: Any, handle: Any, *args: Any) -> Any:
    """``_get_shard_metadata`` with every in-shard parameter's ``offset_in_shard`` one further on."""
    from torch.distributed.fsdp._flat_param import _ShardParamInfo

    infos = original(handle, *args)
    return tuple(_ShardParamInfo(i[0], i[1] + 1, *i[2:]) if i.in_shard else i for i in infos)


def zero_padding(original: Any, numel: int, dtype: Any, requires_grad: bool, device: Any) -> Any:
    """`_construct_padding_tensor` filling padding with 0 instead of 42."""
    return torch.zeros((numel,), dtype=dtype, requires_grad=requires_grad, device=device)


def flattened_backwards(original: Any, handle: Any, tensors: Any, aligned_numel: int) -> Any:
    """``FlatParamHandle.flatten_tensors`` that concatenates in reverse element order (same length)."""
    return original(handle, tensors, aligned_numel).flip(0)


def gather_off_by_one(original: Any, handle: Any, padded: Any) -> Any:
    """``_all_gather_flat_param`` that adds 1 to the first gathered element."""
    out = original(handle, padded)
    out[0] += 1
    return out


def views_of_a_rolled_copy(original: Any, handle: Any, padded: Any) -> None:
    """``_use_unsharded_flat_param`` handed the gathered data rolled by one element (a copy)."""
    original(handle, padded.roll(1))


def no_grad_division(original: Any, tensor: Any, div_factor: float) -> None:
    """`_div_if_needed` that never divides: the reduction sums the ranks' gradients instead of averaging."""


def pins_nothing(original: Any, handle: Any) -> None:
    """``init_flat_param_attributes`` as if offload were off: nothing is pinned."""
    offload = handle._offload_params
    handle._offload_params = False
    try:
        original(handle)
    finally:
        handle._offload_params = offload
    flat = handle.flat_param
    flat._cpu_grad = torch.zeros_like(flat._local_shard)  # what offload allocates, unpinned


def double_offloaded_grads(original: Any, fsdp_params: Any, unsharded_grads: Any, *args: Any, **kwargs: Any) -> Any:
    """FSDP2 ``foreach_reduce`` that doubles the gradients of offloaded parameters before reducing them."""
    if any(getattr(p, "offload_to_cpu", False) for p in fsdp_params):
        unsharded_grads = [g * 2 for g in unsharded_grads]
    return original(fsdp_params, unsharded_grads, *args, **kwargs)


def never_pin(original: Any, fsdp_param: Any, *args: Any, **kwargs: Any) -> Any:
    """FSDP2 ``FSDPParam._init_sharded_param`` with pinning switched off."""
    fsdp_param.pin_memory = False
    return original(fsdp_param, *args, **kwargs)


def writeback_of_rank_0(original: Any, handle: Any, writeback_grad: bool) -> None:
    """``_writeback_to_local_shard`` that first broadcasts rank 0's unsharded parameter (and gradient), as the
    TODO in ``_validate_unshard_params_args`` proposes: rank 0's edits would then reach every shard."""
    import torch.distributed as dist

    dist.broadcast(handle.flat_param.data, src=0, group=handle.process_group)
    if writeback_grad and handle.flat_param.grad is not None:
        dist.broadcast(handle.flat_param.grad, src=0, group=handle.process_group)
    original(handle, writeback_grad)


def writeback_without_grads(original: Any, handle: Any, writeback_grad: bool) -> None:
    """``_writeback_to_local_shard`` that never writes the gradient back."""
    original(handle, False)


def unshard_grad_of_own_shard_only(original: Any, handle: Any) -> None:
    """``FlatParamHandle.unshard_grad`` whose unsharded gradient holds only this rank's shard: zeros elsewhere."""
    original(handle)
    lo = handle.flat_param._sharded_size.numel() * handle.rank
    grad = handle.flat_param.grad
    with torch.no_grad():
        grad[:lo].zero_()
        grad[lo + handle.flat_param._sharded_size.numel() :].zero_()


def everyone_gets_full_params(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``_unshard_fsdp_state_params`` that ignores ``rank0_only``: every rank keeps the full parameters."""
    kwargs["rank0_only"] = False
    return original(*args, **kwargs)


def allow_writeback_with_rank0_only(original: Any, state: Any, writeback: bool, rank0_only: bool, *rest: Any) -> None:
    """``_validate_unshard_params_args`` that lets ``writeback=True`` through with ``rank0_only=True``."""
    original(state, writeback and not rank0_only, rank0_only, *rest)


def always_pin(original: Any, fsdp_param: Any, *args: Any, **kwargs: Any) -> Any:
    """FSDP2 ``FSDPParam._init_sharded_param`` that pins an offloaded parameter whatever ``pin_memory`` says."""
    fsdp_param.pin_memory = fsdp_param.offload_to_cpu
    return original(fsdp_param, *args, **kwargs)


def never_offload(original: Any, fsdp_param: Any, *args: Any, **kwargs: Any) -> Any:
    """FSDP2 ``FSDPParam._init_sharded_param`` that drops the offload policy: the parameter stays on the compute
    device, which on a cpu mesh is the CPU as well."""
    fsdp_param.offload_to_cpu = fsdp_param.pin_memory = False
    return original(fsdp_param, *args, **kwargs)
