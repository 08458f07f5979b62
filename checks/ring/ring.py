"""The ring all-reduce (sum) of the seed's derivation, from ``dist.isend`` / ``dist.irecv``.

The ranks form a logical ring 0 → 1 → … → N−1 → 0: each rank sends only to its right neighbour and receives only
from its left one. The tensor is copied into a buffer of N equal chunks of ``c = ceil(numel / N)`` elements, the
tail padded with zeros (a sum of zeros changes nothing; the padding is cut off at the end).

Phase 1, reduce-scatter (the seed's "Fase 1", N−1 steps): at step k rank i sends chunk (i − k) mod N, receives
chunk (i − 1 − k) mod N from the left and adds it into its own. Afterwards rank i holds chunk (i + 1) mod N
reduced over every rank.

Phase 2, all-gather ("Fase 2", N−1 steps): at step k rank i sends chunk (i + 1 − k) mod N (at k = 0, the one it
reduced) and receives chunk (i − k) mod N, which it copies over its own: that chunk is already fully reduced.

Every step sends one chunk and receives one, and its send is the chunk the previous step received: the 2(N−1)
steps form one chain, each waiting for the last (claim takes-2n-minus-1-steps-at-4).

Each step posts its receive and its send together and waits for both: with blocking ``send`` on every rank first,
every rank could wait for a receiver that is itself still sending.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from checks.ring.traffic import StepRecord, Traffic

REDUCE_SCATTER = "reduce-scatter"
ALL_GATHER = "all-gather"


def chunks_to_exchange(phase: str, rank: int, k: int, world_size: int) -> tuple[int, int]:
    """(chunk sent to the right, chunk received from the left) at step k of a phase, as the seed writes them."""
    if phase == REDUCE_SCATTER:
        return (rank - k) % world_size, (rank - 1 - k) % world_size
    return (rank + 1 - k) % world_size, (rank - k) % world_size


def exchange(outgoing: torch.Tensor, incoming: torch.Tensor, traffic: Traffic) -> None:
    """Send ``outgoing`` right and receive ``incoming`` from the left, concurrently; return when both are done."""
    right = (traffic.rank + 1) % traffic.world_size
    left = (traffic.rank - 1) % traffic.world_size
    receiving = dist.irecv(incoming, src=left)
    sending = dist.isend(outgoing, dst=right)
    traffic.count_send(outgoing)
    traffic.count_recv(incoming)
    sending.wait()
    receiving.wait()


def _chunk(buffer: torch.Tensor, index: int, c: int) -> torch.Tensor:
    return buffer[index * c : (index + 1) * c]


def reduce_scatter_step(buffer: torch.Tensor, c: int, k: int, traffic: Traffic) -> None:
    """One reduce-scatter step: send a partial sum right, add the left neighbour's partial sum into ours."""
    send, recv = chunks_to_exchange(REDUCE_SCATTER, traffic.rank, k, traffic.world_size)
    incoming = torch.empty(c, dtype=buffer.dtype)
    exchange(_chunk(buffer, send, c), incoming, traffic)
    _chunk(buffer, recv, c).add_(incoming)
    traffic.steps.append(StepRecord(REDUCE_SCATTER, k, send, recv, c))


def all_gather_step(buffer: torch.Tensor, c: int, k: int, traffic: Traffic) -> None:
    """One all-gather step: pass a fully reduced chunk right, take the next one from the left."""
    send, recv = chunks_to_exchange(ALL_GATHER, traffic.rank, k, traffic.world_size)
    incoming = torch.empty(c, dtype=buffer.dtype)
    exchange(_chunk(buffer, send, c), incoming, traffic)
    _chunk(buffer, recv, c).copy_(incoming)
    traffic.steps.append(StepRecord(ALL_GATHER, k, send, recv, c))


def chunk_size(numel: int, world_size: int) -> int:
    """Elements per chunk: ceil(numel / N), the smallest size of which N chunks cover the tensor."""
    return -(-numel // world_size)


def ring_all_reduce(tensor: torch.Tensor) -> Traffic:
    """Sum ``tensor`` over the default group in place, by the ring; return what this rank sent and received."""
    rank, n = dist.get_rank(), dist.get_world_size()
    numel = tensor.numel()
    c = chunk_size(numel, n)
    traffic = Traffic(rank, n, chunk_numel=c, padding_numel=n * c - numel)
    if n == 1:
        return traffic
    buffer = torch.zeros(n * c, dtype=tensor.dtype)  # the padding: zeros after the tensor's elements
    buffer[:numel].copy_(tensor.reshape(-1))
    for k in range(n - 1):
        reduce_scatter_step(buffer, c, k, traffic)
    for k in range(n - 1):
        all_gather_step(buffer, c, k, traffic)
    tensor.copy_(buffer[:numel].view(tensor.shape))
    return traffic
