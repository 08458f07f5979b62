"""What guide 09's claims build and compare with: mini_gpt tiny as four NO_SHARD units, the same model unwrapped (the
reference for local gradients and for DDP), and the ratios of one gradient to another."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy

from checks.ranks.context import RankContext
from checks.workloads.gpt import fsdp1_gpt
from mini_gpt import GPT, preset

LR = 1e-3


def no_shard_gpt(ctx: RankContext, **kwargs: Any) -> FSDP:
    """mini_gpt tiny as four NO_SHARD units; the deprecation warning is the subject of its own claim only."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy.NO_SHARD, **kwargs)


def build_replica(ctx: RankContext) -> GPT:
    """The same model, same seed, unwrapped: the reference for local gradients and for DDP."""
    return GPT(preset("tiny"), seed=0).to(ctx.device)


def distinct_ratios(numerator: torch.Tensor, denominator: torch.Tensor) -> list[float]:
    """The distinct values of numerator / denominator where the denominator is not zero."""
    keep = denominator != 0
    return sorted(torch.unique(numerator[keep] / denominator[keep]).tolist())
