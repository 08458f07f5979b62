"""Guide 16's behaviour bent on purpose: the break-it recipes `tests/break_it/test_16_fsdp2_per_parameter_sharding.py`
applies (the chunk rule, the padding, the local tensor's storage, the all-gather's copy-in and copy-out, the spec
itself, and the reshard's handling of ``keep_unsharded_storage`` on either side of torch 2.15)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def split_like_tensor_split(original: Any, tensor: Any, num_chunks: int, dim: int) -> Any:
    """``_chunk_with_empty`` with ``torch.tensor_split``'s rule: 9 rows on 4 ranks become 3, 2, 2, 2."""
    return list(torch.tensor_split(tensor, num_chunks, dim=dim))


def pads_with_ones(original: Any, fsdp_param: Any, *args: Any, **kwargs: Any) -> Any:
    """``_init_sharded_param``, then the padding of ``_sharded_param_data`` filled with ones instead of zeros."""
    out = original(fsdp_param, *args, **kwargs)
    data, local = fsdp_param._sharded_param_data, fsdp_param.sharded_param.to_local()
    data[local.numel() :] = 1
    return out


def own_local_copy(original: Any, fsdp_param: Any, *args: Any, **kwargs: Any) -> Any:
    """``_init_sharded_param``, then a local tensor that is a copy of its rows, not a view of the padded buffer."""
    out = original(fsdp_param, *args, **kwargs)
    copy = fsdp_param.sharded_param.to_local().clone()
    requires_grad = fsdp_param.sharded_param.requires_grad
    fsdp_param.sharded_param = nn.Parameter(fsdp_param.to_sharded_dtensor(copy), requires_grad=requires_grad)
    fsdp_param._setattr_on_modules(fsdp_param.sharded_param)
    return out


def copy_out_off_by_one(original: Any, result: Any, fsdp_params: Any, *args: Any, **kwargs: Any) -> Any:
    """``foreach_all_gather_copy_out``, then 1 added to every parameter's all-gather output."""
    out = original(result, fsdp_params, *args, **kwargs)
    for fsdp_param in fsdp_params:
        for tensor in fsdp_param.all_gather_outputs:
            with torch.autograd._unsafe_preserve_version_counter(tensor):
                tensor.add_(1)
    return out


def rolled_inputs(original: Any, fsdp_params: Any) -> Any:
    """``_get_param_all_gather_inputs`` with every input rolled by one element."""
    return [[t.roll(1) for t in inputs] for inputs in original(fsdp_params)]


def one_nth(original: Any, shape: Any, world_size: int) -> int:
    """The spec's padded chunk replaced by the naive ``numel / N`` (no padding)."""
    total = 1
    for d in shape:
        total *= d
    return total // world_size


def frees_regardless(original: Any, fsdp_param: Any) -> Any:
    """``to_sharded`` as torch before 2.15 wrote it: free the unsharded storage whatever ``keep_unsharded_storage``
    says."""
    out = original(fsdp_param)
    fsdp_param.free_unsharded_param()
    return out


def honours_keep(original: Any, fsdp_param: Any) -> Any:
    """``to_sharded`` as torch 2.15 writes it, on an older torch: free only ``if not self.keep_unsharded_storage``."""
    if not getattr(fsdp_param, "keep_unsharded_storage", False):
        return original(fsdp_param)
    fsdp_param.free_unsharded_param = lambda: None
    try:
        return original(fsdp_param)
    finally:
        del fsdp_param.free_unsharded_param


def fresh_outputs(original: Any, fsdp_param: Any, *args: Any, **kwargs: Any) -> Any:
    """``init_all_gather_outputs`` that always allocates new output tensors (so the storage moves each unshard)."""
    fsdp_param.all_gather_outputs = []
    return original(fsdp_param, *args, **kwargs)
