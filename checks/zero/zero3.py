"""ZeRO-3: ZeRO-2, and each rank keeps only its shard of the parameters.

Each group's whole parameters exist only while the group computes. The model's parameters are views into the
group's padded flat buffer, whose storage is allocated and filled by an all-gather just before use and resized to
zero right after, exactly FSDP1's unshard and reshard (guide 03: ``_full_param_padded``, `_alloc_storage`,
`_free_storage`). Autograd saves those same views in forward; backward gathers into the same storage again before
it reads them.

- forward: a group's pre-forward hook gathers it; its forward hook frees it (FULL_SHARD's
  `_post_forward_reshard`), and registers a hook on each of the group's outputs that needs a gradient (a
  tensor, or the tensors of a tuple, list or dict) that gathers it again when the first of their gradients
  arrives, the start of the group's backward (FSDP1's `_pre_backward_hook`, guide 07). The hook runs once per
  forward, as FSDP1's does (``_ran_pre_backward_hook``, reset by each forward's hook registration): an output
  that is one of the group's inputs passed through (T5's blocks return the position bias they were given) gets
  its whole gradient only after the blocks before it have run their backward, and gathering then would leave
  the group unsharded;
- backward: when the group's last gradient is in, reduce-scatter (ZeRO-2) and free the group's parameters (FSDP1's
  `_post_backward_hook` reshards there too);
- the root group (everything outside the blocks: the embeddings, the last LayerNorm and the tied head) is used at
  both ends of forward; it is gathered in the model's pre-forward and kept until its gradients are reduced, as
  FSDP1 keeps its root unsharded after forward (guide 03). A model whose root holds no parameter of its own has
  no root group;
- ``prefetch=True``: a group's pre-forward also starts the next group's all-gather (asynchronously), and its
  pre-backward the previous group's, so one communication overlaps one group's compute (guides 04, 06). Off by
  default: on gloo it changes when memory is held, not what is computed.

Where the seeds' ZeRO-3 differs: it gathers per parameter per module in full backward hooks, and reduces
after backward (its ZeRO-2's `_sync_gradients`), so every full gradient is alive at the end of backward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_leaves

from checks.zero.groups import FlatGroup
from checks.zero.zero2 import Zero2


class Zero3(Zero2):
    stage = 3

    def __init__(self, model: nn.Module, groups: Any, *, prefetch: bool = False, **kwargs: Any) -> None:
        self.prefetch = prefetch
        super().__init__(model, groups, **kwargs)
        root = [g for g in self.groups if g.name == "root"]  # `module_groups`' root, first when it has parameters
        self.root = root[0] if root else None
        self.blocks = [g for g in self.groups if g.name != "root"]  # forward order: the order `groups` names them
        self.ran_pre_backward = [False] * len(self.blocks)
        if self.root is not None:
            model.register_forward_pre_hook(lambda module, args: self._gather(self.root))
        for i, group in enumerate(self.blocks):
            module = self.modules[group.name]
            module.register_forward_pre_hook(lambda module, args, i=i: self._pre_forward(i))
            module.register_forward_hook(lambda module, args, output, i=i: self._post_forward(i, output))

    # -- parameters: a shard each, a whole buffer only while in use -------------------------------------------------
    def _place_params(self, group: FlatGroup, values: list[torch.Tensor]) -> None:
        group.full = group.flatten(values, self.dtype)
        for param, view in zip(group.params, group.views(group.full), strict=True):
            param.data = view
        group.local = group.full[group.lo : group.hi].clone()  # this rank's shard, its only persistent copy
        group.pending = None  # an all-gather started by a prefetch and not yet waited for
        self._free(group)

    def _gather(self, group: FlatGroup, async_op: bool = False) -> None:
        """Allocate the group's buffer and all-gather the shards into it (FSDP1: `FlatParamHandle.unshard`)."""
        if group.pending is not None:
            group.pending.wait()
            group.pending = None
        storage = group.full.untyped_storage()
        if storage.nbytes():
            return  # already gathered (the root; a prefetched group)
        storage.resize_(group.padded * group.full.element_size())
        work = dist.all_gather(
            list(group.full.chunk(self.world_size)), group.local, group=self.process_group, async_op=async_op
        )
        group.pending = work if async_op else None

    def _free(self, group: FlatGroup) -> None:
        """Release the whole parameters (FSDP1: `_free_storage`, a resize to 0); the views stay, empty."""
        if group.pending is not None:
            group.pending.wait()
            group.pending = None
        group.full.untyped_storage().resize_(0)

    # -- hooks ---------------------------------------------------------------------------------------------------
    def _pre_forward(self, i: int) -> None:
        self._gather(self.blocks[i])
        if self.prefetch and i + 1 < len(self.blocks):
            self._gather(self.blocks[i + 1], async_op=True)

    def _post_forward(self, i: int, output: Any) -> None:
        self.ran_pre_backward[i] = False
        if torch.is_grad_enabled():
            for tensor in tree_leaves(output):  # the first gradient to arrive gathers; the others return
                if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                    tensor.register_hook(lambda grad: self._pre_backward(i))
        self._free(self.blocks[i])

    def _pre_backward(self, i: int) -> None:
        if self.ran_pre_backward[i]:
            return
        self.ran_pre_backward[i] = True
        self._gather(self.blocks[i])
        if self.prefetch and i > 0:
            self._gather(self.blocks[i - 1], async_op=True)

    def _reduce(self, group: FlatGroup) -> None:
        super()._reduce(group)  # ZeRO-2: reduce-scatter, keep the shard, free the full gradient
        self._free(group)  # and the group's whole parameters: its backward is over

    # -- the step: only the shards change; the next forward gathers them -----------------------------------------
    def _publish(self, group: FlatGroup) -> None:
        pass

    # -- for the checks ------------------------------------------------------------------------------------------
    def held(self) -> Any:
        for group in self.groups:
            yield "unsharded", f"zero3 {group.name} whole parameters", group.full
        yield from super().held()

    def full_params(self) -> dict[str, torch.Tensor]:
        out = {}
        for group in self.groups:
            flat = torch.empty(group.padded, dtype=self.dtype, device=group.local.device)
            dist.all_gather(list(flat.chunk(self.world_size)), group.local, group=self.process_group)
            out.update({n: v.clone() for n, v in zip(group.names, group.views(flat), strict=True)})
        return out
