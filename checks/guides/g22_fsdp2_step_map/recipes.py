"""Guide 22's break-it recipes: FSDP2's step bent on purpose (`tests/break_it/test_22_fsdp2_step_map.py` applies
them, with the generic patches of `checks.breakit.patches`): lazy init run again every step, the pre-backward
hook turned into an autograd Function, and a root that hooks one output fewer on one rank."""

from __future__ import annotations

from typing import Any


def lazy_init_every_step(original: Any, self: Any) -> None:
    """``FSDPState._lazy_init`` that forgets the root at the start of every step, so its body runs each time: every
    state is made unchosen again, as before the first forward."""
    ctx = self._state_ctx
    if self._is_root and ctx.iter_forward_root is None:
        for state in ctx.all_states:
            state._is_root = None
        ctx.all_states.clear()
    original(self)


def pre_backward_as_function(original: Any) -> Any:
    """``FSDPState._register_pre_backward_hook`` as a `RegisterPreBackwardFunction` applied to every output that
    needs a gradient, and no tensor hook: the backward still runs ``_pre_backward``, from a graph node."""
    import torch
    from torch.distributed.fsdp._fully_shard._fsdp_state import RegisterPreBackwardFunction
    from torch.distributed.utils import _apply_to_tensors

    def register(self: Any, output: Any) -> Any:
        if not torch.is_grad_enabled():
            return output
        return _apply_to_tensors(lambda t: RegisterPreBackwardFunction.apply(self, t) if t.requires_grad else t,
                                 output)  # fmt: skip

    return register


def root_hooks_only_its_loss_on_rank_1(original: Any, self: Any, output: Any) -> Any:
    """``FSDPState._register_pre_backward_hook`` that, on rank 1, hooks only the root's loss (not its logits): the
    same collectives in the same order (a change to those would hang the ranks, not fail the check), one root
    pre-backward fewer in rank 1's map."""
    import torch.distributed as dist

    if dist.get_rank() == 1 and self._state_ctx.iter_forward_root is self and isinstance(output, tuple):
        original(self, output[1])
        return output
    return original(self, output)


def forward_method_unwrapped(original: Any, module: Any, method_name: str) -> None:
    """``register_fsdp_forward_method`` that checks its arguments and wraps nothing: the method runs no hook."""
    if not hasattr(module, method_name):
        raise ValueError(f"{type(module)} does not have a method {method_name}")


def reshard_recursively(original: Any, self: Any) -> None:
    """``FSDPModule.reshard`` that reshards every FSDP module under ``self`` too (the docstring says it does not)."""
    from torch.distributed.fsdp import FSDPModule

    for module in self.modules():
        if isinstance(module, FSDPModule):
            original(module)


def post_backward_resharding_anyway(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """``FSDPParamGroup.post_backward`` that ignores ``reshard_after_backward`` and reshards, as by default."""
    self.reshard_after_backward = True
    return original(self, *args, **kwargs)


def unshard_in_backward_ignored(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """``FSDPParamGroup.unshard`` that all-gathers in backward whatever ``set_unshard_in_backward`` said."""
    self.unshard_in_backward = True
    return original(self, *args, **kwargs)


def reduce_without_hook(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``foreach_reduce`` that never calls the all-reduce hook it is given."""
    import inspect

    bound = inspect.signature(original).bind(*args, **kwargs)
    bound.arguments["all_reduce_hook"] = None
    return original(*bound.args, **bound.kwargs)


def divide_factor_recursively(original: Any, self: Any, factor: float) -> None:
    """``FSDPModule.set_gradient_divide_factor`` that sets every FSDP module under ``self`` too."""
    from torch.distributed.fsdp import FSDPModule

    for module in self.modules():
        if isinstance(module, FSDPModule):
            original(module, factor)


def max_buffers_in_force_at_once(original: Any, self: Any, max_input_buffers: int, **kwargs: Any) -> None:
    """``FSDPModule.set_reduce_scatter_max_input_buffers`` that also changes the cap already in force."""
    original(self, max_input_buffers, **kwargs)
    comm_ctx = self._get_fsdp_state()._comm_ctx
    if hasattr(comm_ctx, "reduce_scatter_states"):  # lazily initialised: the first forward has run
        comm_ctx.reduce_scatter_max_input_buffers = max_input_buffers


def reset_keeping_callback_flag(original: Any, self: Any) -> None:
    """``FSDPState._reset_iter_state`` that leaves the final callback marked as queued, as the aborted backward
    did."""
    queued = self._state_ctx.post_backward_final_callback_queued
    original(self)
    self._state_ctx.post_backward_final_callback_queued = queued


def cap_never_reached(original: Any, self: Any) -> None:
    """``FSDPState._init_shared_state`` whose cap in force no backward reaches: no retained buffer is reclaimed."""
    original(self)
    self._comm_ctx.reduce_scatter_max_input_buffers = 1_000
