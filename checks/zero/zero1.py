"""ZeRO-1: every rank keeps the whole model and its whole gradient; the optimizer state is sharded.

Per group (`checks.zero.groups`), on each of N ranks:

- parameters: one flat buffer of the whole group, padded to a multiple of N; the model's parameters are views
  into it (FSDP1 does the same with its flat parameter, guide 12);
- gradients: one flat buffer of the same size; the parameters' ``.grad`` are views into it, so autograd
  accumulates straight into it (DDP's ``gradient_as_bucket_view=True`` does the same with its buckets);
- optimizer: AdamW over one tensor per group, this rank's shard ``[lo, hi)`` of the flat parameter; its state is
  1/N of the group's.

When a group's last gradient has been accumulated, one reduce-scatter leaves this rank the sum of every rank's
gradients over its own shard; divided by N it is the mean, written back into the shard's own slice of the
gradient buffer. After the optimizer updates the shard, one all-gather gives every rank every shard again.

Where the seeds' ZeRO-1 differs: it all-reduces every gradient (each rank receives all N shards of the mean) and
then slices out its own. The all-reduce moves 2(N-1)/N of the gradient per rank, the all-gather of the step
another (N-1)/N: 3(N-1)/N in all, where reduce-scatter + all-gather move 2(N-1)/N, DDP's all-reduce alone. A rank
only ever reads its own shard of the mean, so the other N-1 shards of the all-reduce are sent for nothing. The
memory is the same either way: ZeRO-1 keeps the whole local gradient (that is what separates it from ZeRO-2).

Mixed precision (``param_dtype=torch.bfloat16``): the parameter and gradient buffers are bf16 and the optimizer
updates an fp32 copy of the shard (a master copy), as in the ZeRO paper: 2 + 2 bytes per element replicated, and
4 + 8 per element of the shard. FSDP keeps no separate master: its sharded parameter is the fp32 copy (guide 05).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from checks.zero.groups import FlatGroup, module_groups

MakeOptimizer = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


def adamw(params: list[nn.Parameter], lr: float = 1e-3) -> torch.optim.Optimizer:
    """mini_gpt's optimizer (`mini_gpt.train.make_optimizer`), over the shards."""
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)


class Zero1:
    stage = 1

    def __init__(
        self,
        model: nn.Module,
        groups: Sequence[str],
        *,
        make_optimizer: MakeOptimizer = adamw,
        param_dtype: torch.dtype | None = None,
        process_group: Any = None,
    ) -> None:
        """``groups``: the submodules that become groups of their own (mini_gpt: ``blocks.0`` ...); every other
        parameter joins the root group."""
        self.model = model
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.dtype = param_dtype or next(model.parameters()).dtype
        self.groups: list[FlatGroup] = module_groups(model, groups, self.rank, self.world_size)
        self.modules = {name: model.get_submodule(name) for name in groups}
        for group in self.groups:
            full_precision = [p.detach().clone() for p in group.params]
            self._place_params(group, full_precision)
            group.master = self._master(group, full_precision)
            group.grad_shard = None  # this rank's shard of the mean gradient, once reduced
            group.ready = 0  # gradients accumulated so far in this backward
            self._init_grads(group)
            for param in group.params:
                param.register_post_accumulate_grad_hook(partial(self._on_grad, group))
        self.optim = make_optimizer([group.master for group in self.groups])

    # -- parameters ----------------------------------------------------------------------------------------------
    def _place_params(self, group: FlatGroup, values: list[torch.Tensor]) -> None:
        """The whole group in one flat buffer; the model's parameters become views into it, and this rank's
        shard is a slice of it (FSDP1: `FlatParamHandle.flatten_tensors`, then `_use_unsharded_views`)."""
        group.flat = group.flatten(values, self.dtype)
        for param, view in zip(group.params, group.views(group.flat), strict=True):
            param.data = view
        group.local = group.flat[group.lo : group.hi]

    def _master(self, group: FlatGroup, values: list[torch.Tensor]) -> nn.Parameter:
        """What the optimizer updates: the shard itself in fp32; under mixed precision an fp32 copy of it, made
        from the full-precision weights."""
        if self.dtype == torch.float32:
            return nn.Parameter(group.local)  # shares the shard's storage: the step updates the model in place
        return nn.Parameter(group.flatten(values, torch.float32)[group.lo : group.hi].clone())

    # -- gradients -----------------------------------------------------------------------------------------------
    def _init_grads(self, group: FlatGroup) -> None:
        group.flat_grad = torch.zeros(group.padded, dtype=self.dtype, device=group.flat.device)
        for param, view in zip(group.params, group.views(group.flat_grad), strict=True):
            param.grad = view  # autograd accumulates in place into an existing .grad

    def _on_grad(self, group: FlatGroup, param: nn.Parameter) -> None:
        """Post-accumulate-grad hook of every parameter (once per backward, after its gradient is final, a tied
        weight's two uses included): the group is reduced when its last parameter's gradient is in. FSDP1
        hooks the flat parameter's AccumulateGrad instead (`_post_backward_hook`, guide 08)."""
        group.ready += 1
        if group.ready == len(group.params):
            group.ready = 0
            self._reduce(group)

    @torch.no_grad()
    def _reduce(self, group: FlatGroup) -> None:
        """Reduce-scatter the group's gradient buffer: this rank receives the sum over ranks of its own shard only.
        FSDP1: `_reduce_grad`, which calls `dist.reduce_scatter_single` (guide 08)."""
        summed = torch.empty(group.shard_numel, dtype=self.dtype, device=group.flat_grad.device)
        dist.reduce_scatter_single(summed, group.flat_grad, group=self.process_group)
        group.grad_shard = group.flat_grad[group.lo : group.hi]
        group.grad_shard.copy_(summed.div_(self.world_size))

    # -- the step ------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> None:
        """Update this rank's shards, then give every rank the new values."""
        for group in self.groups:
            grad = group.grad_shard
            group.master.grad = grad if grad.dtype == group.master.dtype else grad.to(group.master.dtype)
        self.optim.step()
        for group in self.groups:
            group.master.grad = None  # an fp32 copy of a bf16 gradient lives only for the step
            if group.master.dtype != self.dtype:
                group.local.copy_(group.master)  # the master rounded to the compute dtype
            self._publish(group)

    def _publish(self, group: FlatGroup) -> None:
        """All-gather every rank's shard into the flat buffer (gloo has no all_gather_into_tensor: the list form
        over the buffer's N chunks, as FSDP1 does on CPU). The input is a copy: it is also one of the outputs."""
        dist.all_gather(list(group.flat.chunk(self.world_size)), group.local.clone(), group=self.process_group)

    def zero_grad(self) -> None:
        for group in self.groups:
            group.flat_grad.zero_()
            group.grad_shard = None

    # -- for the checks ------------------------------------------------------------------------------------------
    def held(self) -> Iterator[tuple[str, str, torch.Tensor | None]]:
        """(category, label, tensor) for everything this engine keeps, beyond the optimizer's state."""
        for group in self.groups:
            yield "params", f"zero{self.stage} {group.name} parameters", group.local
            if group.master.dtype != self.dtype:
                yield "master", f"zero{self.stage} {group.name} fp32 master shard", group.master
            yield "grads", f"zero{self.stage} {group.name} gradient", getattr(group, "flat_grad", None)
            yield "grads", f"zero{self.stage} {group.name} gradient shard", group.grad_shard

    def full_params(self) -> dict[str, torch.Tensor]:
        """Every parameter by name, as the model will use it in the next forward."""
        return {n: p.detach().clone() for g in self.groups for n, p in zip(g.names, g.params, strict=True)}

    def full_grads(self) -> dict[str, torch.Tensor]:
        """The mean gradient of every parameter, gathered from the ranks' shards (a collective)."""
        out = {}
        for group in self.groups:
            flat = torch.empty(group.padded, dtype=self.dtype, device=group.params[0].device)
            dist.all_gather(list(flat.chunk(self.world_size)), group.grad_shard.contiguous(), group=self.process_group)
            out.update({n: v.clone() for n, v in zip(group.names, group.views(flat), strict=True)})
        return out
