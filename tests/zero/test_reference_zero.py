"""The reference ZeRO (`checks.zero`) on the rank pool: what each stage communicates and frees within one step,
against counts worked out here from mini_gpt tiny's four units (root and three blocks)."""

from __future__ import annotations

from typing import Any

import pytest

from checks.ranks.manager import PoolManager
from checks.ranks.protocol import CheckRequest

UNITS = 4  # root, blocks.0..2


def run(pool: PoolManager, function: str, world_size: int = 2, **kwargs: Any) -> list[Any]:
    outcome = pool.run(CheckRequest(f"tests.zero.on_ranks:{function}", kwargs=kwargs, world_size=world_size))
    if outcome.skipped:
        pytest.skip(outcome.skipped)
    return outcome.values()


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_collectives_per_step(pool: PoolManager, stage: int) -> None:
    """One reduce-scatter per unit in backward, never an all-reduce; ZeRO-1/2 all-gather each unit once in the
    step, ZeRO-3 once per unit in forward and once per block again in backward (the root is kept)."""
    counts, *others = run(pool, "collectives", stage=stage)
    assert all(other == counts for other in others)
    gathers = {"forward": UNITS, "backward": UNITS - 1, "step": 0} if stage == 3 else {"forward": 0, "backward": 0,
                                                                                       "step": UNITS}  # fmt: skip
    assert counts == {
        "reduce_scatter": {"forward": 0, "backward": UNITS, "step": 0},
        "all_gather": gathers,
        "all_reduce": {"forward": 0, "backward": 0, "step": 0},
    }


def test_zero3_frees_blocks_after_forward(pool: PoolManager) -> None:
    """After forward only the root is gathered; after backward nothing is."""
    for value in run(pool, "zero3_gathered"):
        assert value == {"after forward": ["root"], "after backward": []}


def test_zero2_holds_no_full_gradient_after_backward(pool: PoolManager) -> None:
    for value in run(pool, "full_grads_after_backward"):
        assert value == {1: 40, 2: 0, 3: 0}  # ZeRO-1 keeps all 40 parameters' .grad (views of its buffer)


# -- in this process (no ranks) --------------------------------------------------------------------------------------
def test_groups_pad_at_the_end_and_shard_equally() -> None:
    import torch
    from torch import nn

    from checks.zero.groups import FlatGroup

    params = [nn.Parameter(torch.arange(6.0).view(2, 3)), nn.Parameter(torch.tensor([6.0, 7.0, 8.0]))]
    group = FlatGroup("g", ["a", "b"], params, world_size=4, rank=3)
    assert (group.numel, group.padded, group.lo, group.hi) == (9, 12, 9, 12)  # rank 3: padding only
    flat = group.flatten([p.detach() for p in params], torch.float32)
    assert flat.tolist() == [*range(9), 0.0, 0.0, 0.0]
    assert [v.shape for v in group.views(flat)] == [(2, 3), (3,)]


def test_the_seeds_zero1_slice_breaks_on_a_size_that_does_not_divide() -> None:
    """Seed 002's ZeRO-1 pads each parameter for its shard but slices the *unpadded* gradient
    (``param.grad.view(-1)[shard_start:shard_end]``): on the last rank the slice is short, and assigning it as the
    padded shard's ``.grad`` raises. Its own numbers, replayed: numel 7, world size 2, rank 1."""
    import torch

    numel, world_size, rank = 7, 2, 1
    padded = numel + (world_size - numel % world_size) % world_size
    shard_size = padded // world_size
    shard = torch.zeros(shard_size, requires_grad=True)
    grad = torch.ones(numel)
    with pytest.raises(RuntimeError, match="assign a gradient of size"):
        shard.grad = grad.view(-1)[rank * shard_size : (rank + 1) * shard_size]
