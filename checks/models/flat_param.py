"""FSDP1's flat-parameter layout, written from the rules guides 03 and 05 read in ``_flat_param.py``.

A unit's parameters are concatenated, in registration order, into one 1-D flat parameter. With
``use_orig_params=True`` each parameter starts at a 16-byte boundary *of the dtype the unit computes in*: padding
elements go before a parameter that would start misaligned. A sharded strategy then pads the total to a multiple
of the world size, so every rank holds an equal shard; NO_SHARD does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ALIGNMENT_BYTES = 16


@dataclass(frozen=True)
class FlatLayout:
    """Where each parameter sits in the unsharded flat parameter, and how it splits across ranks."""

    starts: tuple[int, ...]  # offset of each parameter, alignment padding before it included
    numels: tuple[int, ...]
    unpadded_numel: int  # end of the last parameter: the length before world-size padding
    padded_numel: int  # what one all-gather produces
    world_size: int

    @property
    def shard_numel(self) -> int:
        return self.padded_numel // self.world_size

    def shard_range(self, rank: int) -> tuple[int, int]:
        """[start, end) of ``rank``'s shard in the padded unsharded flat parameter."""
        return rank * self.shard_numel, (rank + 1) * self.shard_numel

    def in_shard(self, rank: int) -> tuple[int, ...]:
        """Elements of each parameter inside ``rank``'s shard (0 for a parameter the shard does not touch)."""
        lo, hi = self.shard_range(rank)
        return tuple(
            max(0, min(hi, start + numel) - max(lo, start))
            for start, numel in zip(self.starts, self.numels, strict=True)
        )


def layout(
    numels: Sequence[int], element_bytes: int, world_size: int, *, align: bool = True, sharded: bool = True
) -> FlatLayout:
    """The layout of a flat parameter over parameters of ``numels`` elements, each ``element_bytes`` wide.

    ``align``: ``use_orig_params=True`` (16-byte alignment between parameters). ``sharded``: a strategy that
    shards (pads the total to a multiple of ``world_size``); NO_SHARD keeps the whole unpadded parameter on each
    rank and ``shard_numel`` is then the whole length."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if element_bytes < 1 or ALIGNMENT_BYTES % element_bytes:
        raise ValueError(f"element size {element_bytes} does not divide the {ALIGNMENT_BYTES}-byte alignment")
    step = ALIGNMENT_BYTES // element_bytes if align else 1
    starts, total = [], 0
    for numel in numels:
        if numel < 0:
            raise ValueError(f"a parameter cannot have {numel} elements")
        total += -total % step  # pad up to the next boundary before this parameter
        starts.append(total)
        total += numel
    padded = total + -total % world_size if sharded else total
    return FlatLayout(tuple(starts), tuple(numels), total, padded, world_size if sharded else 1)


def aligned_numel(numels: Sequence[int], element_bytes: int, align: bool = True) -> int:
    """Elements of the unsharded flat parameter before world-size padding."""
    return layout(numels, element_bytes, 1, align=align).unpadded_numel


def padded_numel(numels: Sequence[int], element_bytes: int, world_size: int, align: bool = True) -> int:
    """Elements of the padded unsharded flat parameter: what one all-gather produces."""
    return layout(numels, element_bytes, world_size, align=align).padded_numel
