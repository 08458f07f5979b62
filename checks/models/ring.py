"""The ring all-reduce as plain arithmetic: bytes per rank, chunk padding, the step schedule, and the (τ, β) time.

All-reduce is a reduce-scatter then an all-gather: 2(N−1)/N·S. All-gather, reduce-scatter and broadcast (as a
pipelined ring) are each (N−1)/N·S. `ring_bytes` is that textbook figure (a fraction when N does not divide S);
the rest of the module is what a real ring over whole elements does (guide 14, `checks.ring`):

- The tensor of ``numel`` elements is cut into N chunks of ``c = ceil(numel / N)`` elements; the last chunks are
  padded with zeros up to ``N·c`` (`chunk_numel`, `padding_numel`). Zeros do not change a sum.
- Step k of the reduce-scatter (k = 0 … N−2): rank r sends chunk (r − k) mod N to its right neighbour, receives
  chunk (r − 1 − k) mod N from its left one and adds it into its own copy. Afterwards rank r holds the fully
  reduced chunk (r + 1) mod N. Step k of the all-gather: rank r sends chunk (r + 1 − k) mod N, receives chunk
  (r − k) mod N and overwrites its copy (`schedule`). 2(N−1) steps in all (`ring_steps`).
- Every step sends one chunk and receives one, so each rank sends ``2(N−1)·c`` elements and receives as many
  (`ring_rank_bytes`): the bound 2(N−1)/N·S plus 2(N−1)/N of the padding's bytes (`ring_padding_bytes`).
- The naive all-reduce (every rank sends its tensor to rank 0, rank 0 sums and sends the sum back to each):
  rank 0 receives and sends (N−1)·S; every other rank sends S and receives S (`naive_rank_bytes`).
- The seed's latency/bandwidth model: each of the 2(N−1) steps costs τ plus its chunk's bytes times β (seconds
  per byte), ``ring_time``; `fit_tau_beta` is its least-squares fit to measured (bytes, seconds) points.

Nothing here imports torch: these are the expected values of guide 14's checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

STEPS = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1, "broadcast": 1}
REDUCE_SCATTER = "reduce-scatter"
ALL_GATHER = "all-gather"


def ring_bytes(op: str, nbytes: int, world_size: int) -> Fraction:
    """Bytes sent per rank (exact: a fraction when N does not divide S)."""
    if op not in STEPS:
        raise ValueError(f"no ring model for {op!r}; one of {', '.join(STEPS)}")
    return Fraction(STEPS[op] * (world_size - 1) * nbytes, world_size)


# -- chunks ----------------------------------------------------------------------------------------------------------
def chunk_numel(numel: int, world_size: int) -> int:
    """Elements per chunk: ceil(numel / N), so that N equal chunks cover the tensor."""
    return -(-numel // world_size)


def padding_numel(numel: int, world_size: int) -> int:
    """Zeros appended so that N chunks of `chunk_numel` are exactly the padded buffer (0 when N divides numel)."""
    return world_size * chunk_numel(numel, world_size) - numel


def chunk_range(index: int, numel: int, world_size: int) -> tuple[int, int]:
    """``[start, stop)`` of chunk ``index`` in the padded buffer."""
    c = chunk_numel(numel, world_size)
    return index * c, (index + 1) * c


# -- the schedule ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """One step of one rank: what it sends right and what it receives from the left."""

    phase: str  # REDUCE_SCATTER | ALL_GATHER
    k: int  # step within the phase, 0 … N−2
    send_chunk: int
    recv_chunk: int

    def as_tuple(self) -> tuple[str, int, int, int]:
        return (self.phase, self.k, self.send_chunk, self.recv_chunk)


def ring_steps(world_size: int) -> int:
    """Sequential steps of the ring all-reduce: N−1 of reduce-scatter, N−1 of all-gather."""
    return 2 * (world_size - 1)


def reduce_scatter_chunks(rank: int, k: int, world_size: int) -> tuple[int, int]:
    """(sent, received) chunk at reduce-scatter step k: the seed's x_i[(i − k) mod N] and x_{i−1}[(i − 1 − k) mod N]."""
    return (rank - k) % world_size, (rank - 1 - k) % world_size


def all_gather_chunks(rank: int, k: int, world_size: int) -> tuple[int, int]:
    """(sent, received) chunk at all-gather step k: rank r starts by sending its reduced chunk (r + 1) mod N."""
    return (rank + 1 - k) % world_size, (rank - k) % world_size


def owned_chunk(rank: int, world_size: int) -> int:
    """The chunk rank r holds fully reduced after the reduce-scatter (the seed: (i + 1) mod N)."""
    return (rank + 1) % world_size


def schedule(rank: int, world_size: int) -> list[Step]:
    """Rank ``rank``'s 2(N−1) steps, in order."""
    steps = [Step(REDUCE_SCATTER, k, *reduce_scatter_chunks(rank, k, world_size)) for k in range(world_size - 1)]
    steps += [Step(ALL_GATHER, k, *all_gather_chunks(rank, k, world_size)) for k in range(world_size - 1)]
    return steps


def contributions_after(world_size: int) -> list[list[set[int]]]:
    """Simulate the reduce-scatter on sets: ``held[r][c]`` is the set of ranks whose chunk c rank r has summed.
    After the reduce-scatter, rank r's chunk (r + 1) mod N holds every rank (the proof the schedule reduces)."""
    held = [[{r} for _ in range(world_size)] for r in range(world_size)]
    for k in range(world_size - 1):
        sent = [set(held[r][reduce_scatter_chunks(r, k, world_size)[0]]) for r in range(world_size)]
        for r in range(world_size):
            left = (r - 1) % world_size
            _, chunk = reduce_scatter_chunks(r, k, world_size)
            assert reduce_scatter_chunks(left, k, world_size)[0] == chunk, "left neighbour sends what r receives"
            held[r][chunk] |= sent[left]
    return held


# -- bytes -----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RankBytes:
    sent: int
    received: int


def ring_rank_bytes(numel: int, itemsize: int, world_size: int) -> RankBytes:
    """Bytes each rank sends and receives in the padded ring: one chunk each way per step."""
    per_step = chunk_numel(numel, world_size) * itemsize
    total = ring_steps(world_size) * per_step if world_size > 1 else 0
    return RankBytes(total, total)


def ring_padding_bytes(numel: int, itemsize: int, world_size: int) -> Fraction:
    """What the padding adds to each rank's sent bytes: 2(N−1)/N of the padding's bytes."""
    return ring_bytes("all_reduce", padding_numel(numel, world_size) * itemsize, world_size)


def naive_rank_bytes(nbytes: int, rank: int, world_size: int) -> RankBytes:
    """Reduce to rank 0, then broadcast from it, as N−1 point-to-point messages each way."""
    if rank == 0:
        return RankBytes((world_size - 1) * nbytes, (world_size - 1) * nbytes)
    return RankBytes(nbytes, nbytes)


# -- the (τ, β) model --------------------------------------------------------------------------------------------------
def ring_time(nbytes: float, world_size: int, tau: float, beta: float) -> float:
    """Seconds for the ring all-reduce of ``nbytes`` on N ranks: 2(N−1) steps of τ + (S/N)·β each."""
    return ring_steps(world_size) * (tau + nbytes / world_size * beta)


def message_time(nbytes: float, tau: float, beta: float) -> float:
    """Seconds for one message of ``nbytes``: τ + S·β."""
    return tau + nbytes * beta


def fit_tau_beta(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (τ, β) of ``seconds = τ + bytes·β`` over (bytes, seconds) points, weighted by 1/seconds² so
    that small and large messages count alike (a relative-error fit)."""
    if len(points) < 2:
        raise ValueError("a line needs at least two points")
    # minimise sum(((tau + x*beta) - y)^2 / y^2): normal equations of the weighted problem
    sw = sx = sy = sxx = sxy = 0.0
    for x, y in points:
        w = 1.0 / (y * y)
        sw, sx, sy, sxx, sxy = sw + w, sx + w * x, sy + w * y, sxx + w * x * x, sxy + w * x * y
    det = sw * sxx - sx * sx
    if det == 0:
        raise ValueError("all points have the same size")
    beta = (sw * sxy - sx * sy) / det
    tau = (sy - beta * sx) / sw
    return tau, beta


def relative_errors(predicted: Sequence[float], measured: Sequence[float]) -> list[float]:
    """(predicted − measured) / measured, point by point."""
    return [(p - m) / m for p, m in zip(predicted, measured, strict=True)]
