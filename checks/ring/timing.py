"""Rank-side timings for ``benchmarks/test_ring_model.py``: one-way message times between ranks 0 and 1 (the
points the (τ, β) fit is made on), and the times of the ring and of gloo's ``dist.all_reduce`` per size.

Each timing is taken on rank 0 with ``time.perf_counter`` and is the median of ``repeats`` runs, each started
right after a barrier so that no rank begins early. Tensors are float32; sizes are in bytes.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from checks.ranks.context import RankContext
from checks.ring.ring import ring_all_reduce


def _median_seconds(run: Any, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _one_way(tensor: torch.Tensor, rank: int) -> None:
    """A ping-pong between ranks 0 and 1 (others idle): half its time is one message's."""
    if rank == 0:
        dist.send(tensor, dst=1)
        dist.recv(tensor, src=1)
    elif rank == 1:
        dist.recv(tensor, src=0)
        dist.send(tensor, dst=0)


def timings(ctx: RankContext, sizes: list[int], repeats: int = 25, p2p: bool = True) -> dict[str, Any]:
    """Median seconds per size: ``one_way`` (half a ping-pong, if ``p2p``), ``ring`` and ``gloo``."""
    out: dict[str, Any] = {"sizes": sizes, "world_size": ctx.world_size, "one_way": [], "ring": [], "gloo": []}
    for nbytes in sizes:
        tensor = torch.ones(nbytes // 4)
        for _ in range(2):  # warm-up: connections, allocations
            ring_all_reduce(tensor.clone())
            dist.all_reduce(tensor.clone())
            if p2p:
                _one_way(tensor, ctx.rank)
        if p2p:
            out["one_way"].append(_median_seconds(lambda t=tensor: _one_way(t, ctx.rank), repeats) / 2)
        out["ring"].append(_median_seconds(lambda t=tensor: ring_all_reduce(t), repeats))
        out["gloo"].append(_median_seconds(lambda t=tensor: dist.all_reduce(t), repeats))
    return out
