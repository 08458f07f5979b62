"""Guide 21's break-it recipes: the tensor-parallel styles, the pipeline's messages, orders, IR and activations,
and FSDP2's tensor-parallel placements, bent on purpose (tests/break_it/test_21_strategy_table.py applies them).
The guide has no exercises."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def colwise_bias_replicated(original: Callable[..., Any], self: Any, name: str, module: nn.Module,
                            device_mesh: Any) -> None:  # fmt: skip
    """``ColwiseParallel._partition_linear_fn`` that replicates the bias instead of sharding it."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    original(self, name, module, device_mesh)
    full = module.bias.full_tensor().detach()
    module.register_parameter("bias", nn.Parameter(distribute_tensor(full, device_mesh, [Replicate()])))


def colwise_neighbours_rows(original: Callable[..., Any], self: Any, name: str, module: nn.Module,
                            device_mesh: Any) -> None:  # fmt: skip
    """``ColwiseParallel._partition_linear_fn`` whose ranks hold the next rank's rows: same placement and shape,
    another slice."""
    from torch.distributed.tensor import DTensor, Shard

    original(self, name, module, device_mesh)
    n, rank = device_mesh.size(), device_mesh.get_local_rank()
    full = module.weight.full_tensor().detach()
    local = full.chunk(n, dim=0)[(rank + 1) % n].contiguous()
    module.register_parameter("weight", nn.Parameter(DTensor.from_local(local, device_mesh, [Shard(0)])))


def rowwise_scatter_then_gather(original: Callable[..., Any], self: Any, module: nn.Module, device_mesh: Any) -> Any:
    """``RowwiseParallel._apply`` whose output is reduce-scattered then all-gathered (a hook before the style's
    own): the bytes of an all-reduce, in two collectives."""
    from torch.distributed.tensor import Shard

    applied = original(self, module, device_mesh)
    module.register_forward_hook(lambda mod, args, output: output.redistribute(placements=(Shard(-1),)), prepend=True)
    return applied


def rowwise_reduces_a_copy(original: Callable[..., Any], self: Any, module: nn.Module, device_mesh: Any) -> Any:
    """``RowwiseParallel._apply`` whose output hook all-reduces a copy of the partial output and hands on a
    replicated DTensor with its values: the same values, count and size, another tensor moved."""
    from torch.distributed.tensor import DTensor, Replicate

    applied = original(self, module, device_mesh)

    def hook(mod: nn.Module, args: Any, output: Any) -> Any:
        local = output.to_local()
        with torch.no_grad():
            reduced = local.clone()
            dist.all_reduce(reduced, group=device_mesh.get_group())
        return DTensor.from_local(local + (reduced - local).detach(), device_mesh, [Replicate()], run_check=False)

    module.register_forward_hook(hook, prepend=True)
    return applied


def rowwise_never_reduced(original: Callable[..., Any], self: Any, module: nn.Module, device_mesh: Any) -> Any:
    """``RowwiseParallel._apply`` whose output is declared replicated without its all-reduce: each rank goes on
    with its own partial sum."""
    from torch.distributed.tensor import DTensor, Replicate

    applied = original(self, module, device_mesh)

    def hook(mod: nn.Module, args: Any, output: Any) -> Any:
        return DTensor.from_local(output.to_local(), device_mesh, [Replicate()], run_check=False)

    module.register_forward_hook(hook, prepend=True)
    return applied


def input_left_plain(original: Callable[..., Any], self: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
    """``PrepareModuleInput._prepare_input_arg`` that leaves the input a plain tensor."""
    return input


def doubled_sends(original: Callable[..., Any], self: Any, chunk: int) -> list[Any]:
    """``get_fwd_send_ops`` that sends each activation twice (`doubled_receives` takes the copy): a schedule that
    moves twice the bytes."""
    ops = original(self, chunk)
    return ops + [dist.P2POp(op.op, op.tensor, op.peer, op.group) for op in ops]


def doubled_receives(original: Callable[..., Any], self: Any, chunk: int) -> list[Any]:
    """``get_fwd_recv_ops`` that also receives `doubled_sends`'s copy, into a buffer nobody reads."""
    ops = original(self, chunk)
    return ops + [dist.P2POp(op.op, torch.empty_like(op.tensor), op.peer, op.group) for op in ops]


def initialized_every_step(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """``_initialize_stage`` that forgets the stage was initialized: every step exchanges the shapes again."""
    self._stage_forward_initialized = self._stage_backward_initialized = False
    return original(self, *args, **kwargs)


def runs_gpipe(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """``Schedule1F1B._step_microbatches`` that runs GPipe's order."""
    from torch.distributed.pipelining import ScheduleGPipe

    return ScheduleGPipe._step_microbatches(self, *args, **kwargs)


def runs_1f1b(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """``ScheduleGPipe._step_microbatches`` that runs 1F1B's order."""
    from torch.distributed.pipelining import Schedule1F1B

    return Schedule1F1B._step_microbatches(self, *args, **kwargs)


def keeps_idle_slots(original: Callable[..., Any], actions: list[Any], n_microbatches: int) -> list[Any]:
    """``_add_reduce_grad`` that keeps the idle ``None`` entries, as the IR's docstring says."""
    kept = original(actions, n_microbatches)
    return [None] * sum(1 for a in actions if a is None) + kept


def last_stage_from_zero(original: Callable[..., Any], self: Any) -> Any:
    """``Schedule1F1B._get_pipeline_order`` with the last stage's off-by-one fixed: its forwards named F0 …"""
    from torch.distributed.pipelining.schedules import _Action, _ComputationType

    order = original(self)
    last = self._num_stages - 1
    order[last] = [_Action(a.stage_index, a.computation_type, a.microbatch_index - 1)
                   if a is not None and a.computation_type == _ComputationType.FORWARD else a
                   for a in order[last]]  # fmt: skip
    return order


def keeps_activations(original: Callable[..., Any], self: Any, bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
    """``backward_one_chunk`` that puts the microbatch's forward state back after its backward: a stage that
    never frees activations within a step."""
    from checks.probes.stages import _forward_cache

    cache = _forward_cache(self)
    entry = cache.get(bwd_chunk_id)
    result = original(self, bwd_chunk_id, *args, **kwargs)
    if entry is not None:
        cache[-1 - bwd_chunk_id] = entry  # under another key: the schedule never asks for it again
    return result


def strided_as_plain(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """``FSDPParam._init_sharding_spec_tp`` that places a tensor-parallel parameter ``Shard`` on dp where it
    would be ``_StridedShard``: the same local rows, described as contiguous ones."""
    import dataclasses

    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    out = original(self, *args, **kwargs)
    plain = tuple(Shard(p.dim) if isinstance(p, _StridedShard) else p for p in self._spmd_placements)
    self._spmd_placements = plain
    self._sharding_spec = dataclasses.replace(self._sharding_spec, placements=plain)
    return out


def first_stage_warms_up_less(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """``Schedule1F1B._step_microbatches`` whose first stage forwards one microbatch fewer before its first
    backward (its warm-up reads ``p − 1`` stages): it then waits on the whole pipeline for every backward."""
    if self._stage.stage_index != 0:
        return original(self, *args, **kwargs)
    self._num_stages -= 1
    try:
        return original(self, *args, **kwargs)
    finally:
        self._num_stages += 1
