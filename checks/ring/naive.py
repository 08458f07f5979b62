"""The naive all-reduce (sum): reduce to rank 0, then broadcast from it, from ``dist.send`` / ``dist.recv``.

Every other rank sends its whole tensor to rank 0 (N−1 messages of S bytes into rank 0); rank 0 adds them in rank
order; then it sends the sum to every other rank (N−1 messages of S bytes out of rank 0). Rank 0 sends (N−1)·S
and receives (N−1)·S: at N = 2 that is the bound 2(N−1)/N·S = S, at N = 4 twice it (claim
naive-overloads-rank-0-at-4).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from checks.ring.traffic import Traffic


def naive_all_reduce(tensor: torch.Tensor) -> Traffic:
    """Sum ``tensor`` over the default group in place through rank 0; return this rank's traffic."""
    rank, n = dist.get_rank(), dist.get_world_size()
    traffic = Traffic(rank, n)
    flat = tensor.reshape(-1)
    if rank == 0:
        incoming = torch.empty_like(flat)
        for src in range(1, n):  # reduce: every contribution comes to rank 0
            dist.recv(incoming, src=src)
            traffic.count_recv(incoming)
            flat.add_(incoming)
        for dst in range(1, n):  # broadcast: rank 0 sends the sum to each rank, one message each
            dist.send(flat, dst=dst)
            traffic.count_send(flat)
    else:
        dist.send(flat, dst=0)
        traffic.count_send(flat)
        dist.recv(flat, src=0)
        traffic.count_recv(flat)
    if flat.data_ptr() != tensor.data_ptr():  # reshape copied (a non-contiguous tensor): write the sum back
        tensor.copy_(flat.view(tensor.shape))
    return traffic
