"""Guide 18's break-it recipes (`tests/break_it/test_18_fsdp2_reshard_and_gradients.py` applies them): a root
resharded under the default, an int N read as False, an int 1 that no longer warns, a post-forward reshard made a
full one, groups kept unsharded, a sum that is not divided, a policy's reduce dtype dropped or forced to bf16, a
gradient sync that cannot be turned off, a reduce-scatter per use; and each side of torch 2.15's gradient dtype
bent toward the other's."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


def root_resharded_anyway(original: Any, state: Any) -> None:
    """``FSDPState._lazy_init`` that gives the root its post-forward mesh back: the default reshards the root."""
    keep = {id(g): g.post_forward_mesh_info for g in state._fsdp_param_groups}
    original(state)
    for group in state._fsdp_param_groups:
        if group.post_forward_mesh_info is None and keep[id(group)] is not None:
            group.post_forward_mesh_info = keep[id(group)]


def int_n_means_false(original: Any, reshard_after_forward: Any, mesh_info: Any) -> Any:
    """``_get_post_forward_mesh_info`` that reads an int equal to the shard world size as ``False``."""
    if not isinstance(reshard_after_forward, bool) and reshard_after_forward == mesh_info.shard_mesh_size:
        return None
    return original(reshard_after_forward, mesh_info)


def silent_int_one(original: Any, reshard_after_forward: Any, mesh_info: Any) -> Any:
    """``_get_post_forward_mesh_info`` that maps an int 1 to ``False`` without logging."""
    if not isinstance(reshard_after_forward, bool) and reshard_after_forward == 1:
        return None
    return original(reshard_after_forward, mesh_info)


def reshard_fully(original: Any, group: Any) -> None:
    """``FSDPParamGroup._to_sharded_post_forward`` replaced by a full reshard: an int behaves as ``True``."""
    group._to_sharded()


def sum_without_divide(original: Any, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    """``_get_gradient_divide_factors`` that asks for a plain SUM and divides nowhere: a sum, not a mean."""
    from torch.distributed import ReduceOp

    return None, None, ReduceOp.SUM, ReduceOp.SUM


def never_divide(original: Any, tensor: Any, div_factor: Any) -> None:
    """``_div_if_needed`` that never divides."""


def reduce_dtype_ignored(original: Any, fsdp_param: Any, mp_policy: Any) -> None:
    """``FSDPParam.init_dtype_attrs`` with the policy's ``reduce_dtype`` dropped."""
    original(fsdp_param, dataclasses.replace(mp_policy, reduce_dtype=None))


def reduce_in_bf16(original: Any, fsdp_param: Any, mp_policy: Any) -> None:
    """``FSDPParam.init_dtype_attrs`` that reduces every gradient in bf16 whatever the policy says."""
    original(fsdp_param, dataclasses.replace(mp_policy, reduce_dtype=torch.bfloat16))


def sync_ignored(original: Any, module: Any, requires_gradient_sync: bool, **kwargs: Any) -> None:
    """``set_requires_gradient_sync`` that does nothing: every backward reduce-scatters."""


def keep_unsharded_after_forward(original: Any, group: Any) -> None:
    """``FSDPParamGroup.reshard`` that does nothing in forward: every setting behaves as False."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

    if group._training_state == TrainingState.FORWARD:
        return None
    return original(group)


def reduce_every_post_backward(original: Any, group: Any, *args: Any) -> None:
    """``FSDPParamGroup.post_backward`` with ``reduce_scatter_unused_params`` on: a post-backward that finds no
    gradient reduce-scatters zeros instead of returning."""
    group.reduce_scatter_unused_params = True
    return original(group, *args)


def keep_unsharded_after_backward(original: Any, group: Any, *args: Any) -> None:
    """``FSDPParamGroup.post_backward`` that does not reshard (``reshard_after_backward`` off)."""
    group.reshard_after_backward = False
    return original(group, *args)


def reduce_in_gradient_dtype(original: Any, group: Any, fsdp_params: Any, grads: Any) -> Any:
    """``FSDPParamGroup._get_reduce_dtype`` (2.15) as 2.13 chose: the policy's reduce dtype, else the gradients'
    own dtype (``reduce_dtype or grad_dtype``), so bf16 compute reduces in bf16 again."""
    return group._reduce_dtype or grads[0].dtype


def upcast_always_deferred(original: Any, group: Any, defer_upcast: bool) -> None:
    """``FSDPParamGroup._set_unsharded_grad_dtypes`` (2.15) always in its deferring branch: it never casts a waiting
    gradient up, and switches autograd's cast off once a gradient exists or the group reduces, so after a synced
    step a gradient computed in bf16 waits in bf16."""
    return original(group, defer_upcast=True)


def grad_dtype_unset(original: Any, fsdp_param: Any) -> None:
    """``FSDPParam.init_unsharded_param`` (2.15) without the ``grad_dtype`` it sets: autograd adds a tied weight's
    gradients in fp32 again, and the copy-in rounds the sum."""
    original(fsdp_param)
    if (param := getattr(fsdp_param, "_unsharded_param", None)) is not None:
        param.grad_dtype = None


def grad_dtype_is_reduce_dtype(original: Any, fsdp_param: Any) -> None:
    """``FSDPParam.init_unsharded_param`` (2.13) that sets 2.15's ``grad_dtype``, the reduce dtype: autograd rounds
    each of a tied weight's gradients before it adds them."""
    original(fsdp_param)
    param = getattr(fsdp_param, "_unsharded_param", None)
    if param is not None and fsdp_param.reduce_dtype is not None:
        param.grad_dtype = fsdp_param.reduce_dtype
