"""An independent model of FSDP1's flat-parameter sizes, written from the rules the guides state.

With ``use_orig_params=True`` each original parameter starts at a 16-byte boundary *of the dtype the unit
computes in* (padding elements are inserted before a parameter that would start misaligned); the total is then
padded to a multiple of the world size so every rank holds an equal shard. Checks compare what torch built or
communicated with these numbers; nothing here reads FSDP state.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

ALIGNMENT_BYTES = 16


def aligned_numel(numels: Sequence[int], element_bytes: int, align: bool = True) -> int:
    """Elements of the unsharded flat parameter before world-size padding."""
    step = ALIGNMENT_BYTES // element_bytes if align else 1
    total = 0
    for numel in numels:
        total += -total % step  # pad up to the next boundary before this parameter
        total += numel
    return total


def padded_numel(numels: Sequence[int], element_bytes: int, world_size: int, align: bool = True) -> int:
    """Elements of the padded unsharded flat parameter: what one all-gather produces."""
    total = aligned_numel(numels, element_bytes, align)
    return total + -total % world_size


def gpt_padded_sizes(world_size: int, element_bytes: int, preset_name: str = "tiny") -> dict[str, int]:
    """Padded unsharded flat-parameter sizes of mini_gpt wrapped as root + one unit per block, in unit order
    (root, blocks.0, ...): the all-gather sizes of one forward."""
    from mini_gpt import GPT, preset

    config = preset(preset_name)
    numels = gpt_unit_numels(GPT(config), config.n_layer)
    return {name: padded_numel(n, element_bytes, world_size) for name, n in numels.items()}


def gpt_unit_numels(model: nn.Module, blocks: int) -> dict[str, list[int]]:
    """Parameter sizes per unit of mini_gpt wrapped as root + one unit per block, in registration order (the
    order FSDP flattens them); a tied weight counts once, in its first owner."""
    units: dict[str, list[int]] = {"root": [], **{f"blocks.{i}": [] for i in range(blocks)}}
    for name, param in model.named_parameters():  # named_parameters() skips the tied duplicate
        prefix = ".".join(name.split(".")[:2])
        units[prefix if prefix in units else "root"].append(param.numel())
    return units
