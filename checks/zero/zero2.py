"""ZeRO-2: ZeRO-1, and each rank keeps only its shard of the gradient.

The parameters are whole, as in ZeRO-1. The gradients are not kept in a buffer: autograd allocates each
parameter's ``.grad``; when a group's last one is in, the group's gradients are copied into one padded flat
tensor, freed (``.grad = None``), and reduce-scattered; the rank keeps its shard of the mean and nothing else. At
any moment of backward the full gradients alive are those of groups still accumulating, plus the one group being
reduced: not the whole model's.

Where the seeds' ZeRO-2 differs: it reduces after backward, so every full gradient is alive at the end of
backward, the ZeRO-1 peak; its own text says so ("nuestra implementación simplificada no realiza esto"). FSDP1
SHARD_GRAD_OP frees the same way, from the flat parameter's post-backward hook (guide 08).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from checks.zero.groups import FlatGroup
from checks.zero.zero1 import Zero1


class Zero2(Zero1):
    stage = 2

    def _init_grads(self, group: FlatGroup) -> None:
        pass  # no gradient buffer: autograd allocates each .grad, `_release` frees it

    @torch.no_grad()
    def _reduce(self, group: FlatGroup) -> None:
        flat = group.flatten([p.grad for p in group.params], self.dtype)  # the group's whole gradient, padded
        self._release(group)
        summed = torch.empty(group.shard_numel, dtype=self.dtype, device=flat.device)
        dist.reduce_scatter_single(summed, flat, group=self.process_group)
        mean = summed.div_(self.world_size)
        group.grad_shard = mean if group.grad_shard is None else group.grad_shard.add_(mean)
        # ``flat`` goes out of scope here: of this group's gradient only the shard remains.

    def _release(self, group: FlatGroup) -> None:
        """Free each parameter's full gradient: it has been copied into the flat tensor being reduced."""
        for param in group.params:
            param.grad = None

    def zero_grad(self) -> None:
        for group in self.groups:
            group.grad_shard = None
