"""Guide 08's break-it recipes (tests/break_it/test_08_post_backward_reduce_scatter.py applies them) and its
exercises (``fsdp-readings exercise 08-post-backward-reduce-scatter``)."""

from __future__ import annotations

from typing import Any

import torch

from checks.breakit.exercises import Exercise
from checks.breakit.patches import wrapping

_RU = "torch.distributed.fsdp._runtime_utils"


def sum_not_mean(original: Any, tensor: Any, div_factor: float) -> None:
    """``_div_if_needed`` that never divides: every rank's gradient is summed, not averaged."""


def reduce_scatter_twice(original: Any, output: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
    """``dist.reduce_scatter_single`` issued twice on the same input (the second result is kept)."""
    original(output, input, *args, **kwargs)
    return original(output, input, *args, **kwargs)


def overwrite_instead_of_accumulate(original: Any, state: Any, handle: Any, sharded_grad: Any) -> Any:
    """``_accumulate_sharded_grad`` that forgets the saved gradient shard, so a second backward overwrites it."""
    flat_param = handle.flat_param
    if hasattr(flat_param, "_saved_grad_shard"):
        del flat_param._saved_grad_shard
    return original(state, handle, sharded_grad)


def keep_reduced_dtype(original: Any, state: Any, sharded_grad: Any, param: Any) -> None:
    """``_cast_grad_to_param_dtype`` that leaves the gradient in the dtype it was reduced in."""


def without_postdivide(original: Any, state: Any, handle: Any) -> None:
    """``_reduce_grad`` with the post-divide factor forced to 1: the pre-divide alone is not a mean unless N = 2."""
    state._gradient_postdivide_factor = 1.0
    original(state, handle)


def reduce_in_fp32(original: Any, state: Any, handle: Any, *args: Any) -> Any:
    """``_post_backward_hook`` whose handle reduces in fp32 whatever the policy says."""
    handle._reduce_dtype = torch.float32
    return original(state, handle, *args)


_DEFERRED: list[tuple[Any, Any, Any]] = []


def defer_reduction(original: Any, state: Any, handle: Any) -> None:
    """``_reduce_grad`` that only remembers the unit; `reduce_deferred` reduces them all at the end."""
    _DEFERRED.append((original, state, handle))


def reduce_deferred(original: Any, state: Any, module: Any) -> None:
    """``_post_backward_final_callback`` that first reduces everything `defer_reduction` held back."""
    while _DEFERRED:
        reduce, unit_state, handle = _DEFERRED.pop(0)
        reduce(unit_state, handle)
    original(state, module)


_SWAP: dict[str, Any] = {"held": None, "done": False}


def reduce_first_two_swapped(original: Any, state: Any, handle: Any) -> None:
    """``_reduce_grad`` that holds back the first unit's reduction of a backward and issues it right after the
    second's (blocks.1 before blocks.2: the same sizes, another order); the root's, the last, ends the backward."""
    if _SWAP["held"] is None and not _SWAP["done"]:
        _SWAP["held"] = (state, handle)
        return
    original(state, handle)
    if _SWAP["held"] is not None:
        held_state, held_handle = _SWAP["held"]
        _SWAP["held"], _SWAP["done"] = None, True
        original(held_state, held_handle)
    if state._is_root:
        _SWAP["done"] = False


def pad_with_ones(original: Any, state: Any, unsharded_grad: Any) -> tuple[Any, Any]:
    """``_get_reduce_scatter_tensors`` that pads to the same length with ones instead of zeros."""
    padded, shard = original(state, unsharded_grad)
    if padded.numel() > unsharded_grad.numel():
        padded = padded.clone()
        padded[unsharded_grad.numel() :] = 1.0
    return padded, shard


def pad_a_chunk_more(original: Any, state: Any, unsharded_grad: Any) -> tuple[Any, Any]:
    """``_get_reduce_scatter_tensors`` that pads one whole chunk more than a multiple of N needs."""
    import torch.nn.functional as F

    padded, shard = original(state, unsharded_grad)
    extra = shard.numel() + 1
    return F.pad(padded, [0, extra * state.world_size]), torch.empty(shard.numel() + extra, dtype=shard.dtype)


def clip_without_all_reduce(original: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
    """``FullyShardedDataParallel.clip_grad_norm_`` whose all-reduce of the squared norms does nothing: each rank
    clips by the norm of its own shard."""
    import torch.distributed as dist

    all_reduce = dist.all_reduce
    dist.all_reduce = lambda *a, **k: None
    try:
        return original(model, *args, **kwargs)
    finally:
        dist.all_reduce = all_reduce


def clip_twice_on_rank_1(original: Any, model: Any, max_norm: float, *args: Any) -> Any:
    """``FullyShardedDataParallel.clip_grad_norm_`` after which rank 1 scales its shard by the factor once more."""
    norm = original(model, max_norm, *args)
    if model.rank == 1:
        factor = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(factor)
    return norm


def local_total_norm(original: Any, tensors: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.nn.utils.clip_grad._get_total_norm`` over each DTensor's local tensor: every rank gets the norm of
    its own shards, returned as a replicated DTensor, as if the DTensors' reduction were lost."""
    from torch.distributed.tensor import DTensor, Replicate

    tensors = list(tensors)
    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    norm = original(local, *args, **kwargs)
    mesh = next((t.device_mesh for t in tensors if isinstance(t, DTensor)), None)
    return norm if mesh is None else DTensor.from_local(norm, mesh, [Replicate()])


# -- exercises: recipes above as puzzles (fsdp-readings exercise 08-post-backward-reduce-scatter) ----------------


def clip_without_the_clamp_fsdp1(original: Any, self: Any, max_norm: float, norm_type: float = 2.0) -> Any:
    """FSDP1's ``clip_grad_norm_`` followed by the rest of the unclamped factor: every gradient is multiplied by
    ``max_norm / (norm + 1e-6)`` even when that is above 1."""
    norm = original(self, max_norm, norm_type)
    coef = max_norm / (norm + 1e-6)
    for param in self.parameters():
        if param.grad is not None:
            param.grad.mul_(coef / torch.clamp(coef, max=1.0))
    return norm


def clip_without_the_clamp(original: Any, parameters: Any, max_norm: float, total_norm: Any, *args: Any) -> None:
    """``_clip_grads_with_norm_`` with the factor left unclamped: gradients are scaled up below ``max_norm``."""
    coef = max_norm / (total_norm + 1e-6)
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    for param in params:
        if param.grad is not None:
            param.grad.mul_(coef)


EXERCISES = (
    Exercise(
        "sum-not-mean",
        claim="sharded-grad-is-ddp-slice",
        patches=(wrapping(f"{_RU}:_div_if_needed", sum_not_mean),),
        puzzle="`_div_if_needed` never divides. Training still runs and the loss still falls.",
        reason="not-bitwise",
    ),
    Exercise(
        "reduce-at-the-end",
        claim="reduce-scatter-in-post-backward",
        patches=(
            wrapping(f"{_RU}:_reduce_grad", defer_reduction),
            wrapping(f"{_RU}:_post_backward_final_callback", reduce_deferred),
        ),
        puzzle="`_reduce_grad` only remembers each unit; the final callback reduces them all at the end of backward.",
        reason="reduce-scatter-timing",
    ),
    Exercise(
        "no-post-divide-on-4",
        claim="sharded-grad-close-to-ddp-at-4",
        patches=(wrapping(f"{_RU}:_reduce_grad", without_postdivide),),
        puzzle="`_reduce_grad` runs with the post-divide factor forced to 1. Which claim notices, on 2 or on 4 ranks?",
        reason="beyond-tolerance",
    ),
)
