"""Parameter groups and their flat, padded shards: the layout every ZeRO stage here shares.

A group is one module's parameters (for mini_gpt: each block, and the root with everything else), flattened in
registration order into one 1-D buffer, zero-padded at the end to a multiple of the world size N, and cut into N
equal shards; rank r owns ``[r * c, (r + 1) * c)``, c = padded / N.

This is FSDP1's flat parameter with ``use_orig_params=False`` (guide 12, `checks.models.flat_param` rule 3):
`FlatParamHandle.flatten_tensors` concatenates the unit's parameters with no alignment gaps, and `_get_shard`
chunks the result into N pieces of ceil(numel / N), padding each rank's piece to that length. The padded total is
``ceil(numel / N) * N`` in both, and the padding sits at the end of the last shards in both. What FSDP1 adds and
this does not: 16-byte alignment between parameters under ``use_orig_params=True`` (guide 12), and the bookkeeping
for parameters that straddle shards (``_ShardParamInfo``); here a parameter is only ever used whole, from the
unsharded buffer, so nothing needs to know where it falls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn


def shard_range(padded: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, end) of ``rank``'s shard of a flat buffer of ``padded`` elements (a multiple of the world size).
    FSDP1: ``FlatParamHandle._get_shard`` keeps ``torch.chunk(flat, world_size)[rank]``."""
    size = padded // world_size
    return rank * size, (rank + 1) * size


@dataclass
class FlatGroup:
    """One group's parameters and where each sits in the group's flat buffer."""

    name: str
    names: list[str]
    params: list[nn.Parameter]
    world_size: int
    rank: int
    offsets: list[int] = field(init=False)
    numel: int = field(init=False)  # the parameters, before padding
    padded: int = field(init=False)  # ceil(numel / N) * N: what one all-gather produces
    lo: int = field(init=False)
    hi: int = field(init=False)

    def __post_init__(self) -> None:
        self.offsets, total = [], 0
        for p in self.params:
            self.offsets.append(total)
            total += p.numel()
        self.numel = total
        self.padded = -(-total // self.world_size) * self.world_size
        self.lo, self.hi = shard_range(self.padded, self.world_size, self.rank)

    @property
    def shard_numel(self) -> int:
        return self.hi - self.lo

    def flatten(self, tensors: Sequence[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """One padded flat buffer holding ``tensors`` (one per parameter) end to end; zeros in the padding."""
        flat = torch.zeros(self.padded, dtype=dtype, device=self.params[0].device)
        for tensor, start in zip(tensors, self.offsets, strict=True):
            flat[start : start + tensor.numel()].copy_(tensor.reshape(-1))
        return flat

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's view into ``flat``, in its own shape (FSDP1: `_get_unflat_views`)."""
        return [flat[s : s + p.numel()].view(p.shape) for p, s in zip(self.params, self.offsets, strict=True)]


def module_groups(
    model: nn.Module, names: Sequence[str], rank: int, world_size: int, root: str = "root"
) -> list[FlatGroup]:
    """One group per named submodule in ``names``, and one for every other parameter (the root), root first: the
    FSDP units of `checks.workloads.gpt`. A tied parameter belongs to its first owner only (``named_parameters``
    yields it once), as FSDP1 flattens it once. A frozen parameter (``requires_grad=False``) is in no group: it
    stays whole on every rank and is never reduced or updated, as DDP leaves it out of its buckets."""
    members: dict[str, list[tuple[str, nn.Parameter]]] = {root: [], **{n: [] for n in names}}
    for fqn, param in model.named_parameters():
        if not param.requires_grad:
            continue
        owner = next((n for n in names if fqn.startswith(n + ".")), root)
        members[owner].append((fqn, param))
    return [
        FlatGroup(group, [n for n, _ in found], [p for _, p in found], world_size, rank)
        for group, found in members.items()
        if found
    ]
