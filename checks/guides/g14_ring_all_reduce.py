"""Checks for guide 14, the ring all-reduce: built from ``dist.isend`` / ``dist.irecv`` (`checks.ring.ring`), it
sums exactly what ``dist.all_reduce`` sums, sends the bound 2(N−1)/N·S plus its padding, takes 2(N−1) chained
steps, and does not overload rank 0 as the naive reduce-then-broadcast (`checks.ring.naive`) does.

Expected values never come from the output checked: sums from each rank's seed (`checks.ring.inputs`), bytes,
steps and schedules from the torch-free model (`checks.models.ring`). Bytes are counted three ways and must
agree: by the ring itself where it posts each message, by the dispatcher (`record_comm` sees every
``c10d::send`` / ``c10d::recv_``) and, by count, by gloo's own profiler events (``record_comm``'s cross-check).

Every rank-local comparison runs under ``ctx.agreed`` so that a rank that finds a violation does not leave the
others waiting in the next collective.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from checks.models import ring as model
from checks.models.ring_draws import ITEMSIZE
from checks.probes import calls
from checks.probes.comm import CommLog, record_comm
from checks.ranks.context import RankContext
from checks.ring import naive, ring
from checks.ring.inputs import expected_sum, rank_values
from checks.ring.traffic import StepRecord, Traffic
from checks.violation import Violation, require, require_equal


def _first_difference(observed: torch.Tensor, expected: torch.Tensor) -> dict[str, Any]:
    differ = (observed != expected).nonzero()
    if not len(differ):
        return {}
    i = int(differ[0])
    return {"index": i, "observed_value": float(observed[i]), "expected_value": float(expected[i])}


def _require_same(observed: torch.Tensor, expected: torch.Tensor, *, reason: str, what: str) -> None:
    """Bitwise equal (same dtype, same shape, same values) or a `Violation` naming the first element that differs."""
    if observed.dtype == expected.dtype and observed.shape == expected.shape and torch.equal(observed, expected):
        return
    info = _first_difference(observed, expected) if observed.shape == expected.shape else {}
    where = f" at element {info['index']}: {info['observed_value']} vs {info['expected_value']}" if info else ""
    raise Violation(reason, f"{what} differs{where}", **info)


def _compare_sums(ours: torch.Tensor, theirs: torch.Tensor, want: torch.Tensor, rank: int) -> None:
    _require_same(theirs, want, reason="all-reduce-differs-from-sum", what=f"rank {rank}: dist.all_reduce")
    _require_same(ours, theirs, reason="ring-differs-from-all-reduce", what=f"rank {rank}: the ring's sum")


# -- (1) the ring sums what all_reduce sums ---------------------------------------------------------------------------
def equals_all_reduce(ctx: RankContext, example: dict[str, Any]) -> dict[str, Any]:
    """Property: for the drawn size and dtype, the ring's result is bitwise ``dist.all_reduce``'s, and both are the
    sum of every rank's values rebuilt from their seeds."""
    values = rank_values(example, ctx.rank)
    ours, theirs = values.clone(), values.clone()
    traffic = ring.ring_all_reduce(ours)
    dist.all_reduce(theirs)
    ctx.agreed(_compare_sums, ours, theirs, expected_sum(example, ctx.world_size), ctx.rank)
    return {
        "numel": example["numel"],
        "dtype": example["dtype"],
        "divisible": example["numel"] % ctx.world_size == 0,
        "padding_numel": traffic.padding_numel,
    }


# -- (2) bytes: the bound plus the padding ----------------------------------------------------------------------------
def _dispatcher_bytes(comm: CommLog, op: str) -> int:
    return sum(r.nbytes for r in comm.select(op))


def _gloo_events(comm: CommLog, name: str) -> int:
    return sum(1 for e in (comm.crosscheck.observed if comm.crosscheck else []) if e.name == name)


def _measured(traffic: Traffic, comm: CommLog) -> dict[str, int]:
    return {
        "sent_bytes": traffic.sent_bytes,
        "received_bytes": traffic.received_bytes,
        "dispatcher_sent_bytes": _dispatcher_bytes(comm, "send"),
        "dispatcher_received_bytes": _dispatcher_bytes(comm, "recv"),
        "dispatcher_sends": comm.count("send"),
        "dispatcher_recvs": comm.count("recv"),
        "gloo_send_events": _gloo_events(comm, "send"),
        "gloo_recv_events": _gloo_events(comm, "recv"),
    }


def _check_bytes(seen: dict[str, int], example: dict[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    numel, itemsize = example["numel"], ITEMSIZE[example["dtype"]]
    nbytes = numel * itemsize
    want = model.ring_rank_bytes(numel, itemsize, world_size)
    bound = model.ring_bytes("all_reduce", nbytes, world_size)
    padding = model.ring_padding_bytes(numel, itemsize, world_size)
    require(bound + padding == want.sent, "model-inconsistent", f"bound {bound} + padding {padding} != {want.sent}")
    for what, observed, expected in (
        ("bytes the ring sent", seen["sent_bytes"], want.sent),
        ("bytes the ring received", seen["received_bytes"], want.received),
        ("bytes the dispatcher saw sent (c10d::send)", seen["dispatcher_sent_bytes"], want.sent),
        ("bytes the dispatcher saw received (c10d::recv_)", seen["dispatcher_received_bytes"], want.received),
    ):
        require_equal(observed, expected, reason="bytes-differ", what=f"rank {rank}: {what}", rank=rank)
    messages = model.ring_steps(world_size)
    for what in ("dispatcher_sends", "dispatcher_recvs", "gloo_send_events", "gloo_recv_events"):
        require_equal(seen[what], messages, reason="messages-differ", what=f"rank {rank}: {what}", rank=rank)
    return {"bound": bound, "padding": padding}


def bytes_are_the_bound(ctx: RankContext, example: dict[str, Any]) -> dict[str, Any]:
    """Each rank sends exactly 2(N−1)/N·S plus 2(N−1)/N of the padding's bytes, and receives as much, counted by
    the ring, by the dispatcher, and (as 2(N−1) messages each way) by gloo's profiler events."""
    values = rank_values(example, ctx.rank)
    with record_comm() as comm:  # its cross-check against gloo's events raises if any message went unrecorded
        traffic = ring.ring_all_reduce(values)
    seen = _measured(traffic, comm)
    found = ctx.agreed(_check_bytes, seen, example, ctx.rank, ctx.world_size)
    everyone = ctx.gather(seen["sent_bytes"])
    return {
        "nbytes": example["numel"] * ITEMSIZE[example["dtype"]],
        "sent_bytes": seen["sent_bytes"],
        "sent_bytes_per_rank": everyone,
        "bound_bytes": float(found["bound"]),
        "padding_bytes_sent": float(found["padding"]),
        "padding_numel": traffic.padding_numel,
        "chunk_numel": traffic.chunk_numel,
        "measured": seen,
    }


# -- (3) 2(N−1) chained steps ---------------------------------------------------------------------------------------
def _check_steps(traffic: Traffic, comm: CommLog, numel: int) -> None:
    rank, n = traffic.rank, traffic.world_size
    observed = [s.as_tuple() for s in traffic.steps]
    require_equal(len(observed), model.ring_steps(n), reason="steps-differ", what=f"rank {rank}: steps", rank=rank)
    want = [s.as_tuple() for s in model.schedule(rank, n)]
    require_equal(observed, want, reason="schedule-differs", what=f"rank {rank}: (phase, k, sent, received)")
    for j in range(1, len(traffic.steps)):  # each step sends what the step before received: one chain
        require(
            traffic.steps[j].send_chunk == traffic.steps[j - 1].recv_chunk,
            "chain-broken",
            f"rank {rank}: step {j} sends chunk {traffic.steps[j].send_chunk}, not the chunk "
            f"{traffic.steps[j - 1].recv_chunk} step {j - 1} received",
            step=j,
        )
    c = model.chunk_numel(numel, n)
    sizes = [r.numel for r in comm.select("send")]
    require_equal(sizes, [c] * model.ring_steps(n), reason="messages-differ", what=f"rank {rank}: sent messages")


@contextmanager
def posted_messages() -> Iterator[dict[str, list[torch.Tensor]]]:
    """What this rank hands ``dist.isend``, copied when each send is posted, and the buffer each ``dist.irecv``
    fills (read after the block, once every receive has completed), in call order: the messages themselves, read
    where torch receives them, not the ring's own record of its steps."""
    seen: dict[str, list[torch.Tensor]] = {"sent": [], "received": []}
    send_code = calls.function_code("torch.distributed.distributed_c10d:isend")
    recv_code = calls.function_code("torch.distributed.distributed_c10d:irecv")

    def on_send(frame: Any) -> None:
        seen["sent"].append(frame.f_locals["tensor"].detach().clone())

    def on_recv(frame: Any) -> None:
        seen["received"].append(frame.f_locals["tensor"])

    with calls.subscribed({send_code: on_send, recv_code: on_recv}) as subscription:
        yield seen
    if subscription.errors:
        raise RuntimeError(f"the message recorder failed: {subscription.errors[0]!r}") from subscription.errors[0]


def _check_dependency(seen: dict[str, list[torch.Tensor]], own: torch.Tensor, rank: int, n: int) -> list[str]:
    """Each message this rank sent is what the model says it carries, given the message it received the step
    before: step 0 its own chunk; reduce-scatter steps and the first all-gather step its own chunk plus the
    previous message received (the partial sum it just completed); later all-gather steps the previous message
    received, unchanged. So step j's send carries step j−1's receive: it cannot have been posted before that
    receive arrived. ``own`` is this rank's padded input, rebuilt from its seed."""
    sent, received = seen["sent"], seen["received"]
    steps = model.schedule(rank, n)
    lengths = {"sent": len(sent), "received": len(received)}
    require_equal(lengths, dict.fromkeys(lengths, len(steps)), reason="steps-differ", what=f"rank {rank}: messages")
    c = own.numel() // n
    carries = []
    for j, step in enumerate(steps):
        chunk = own[step.send_chunk * c : (step.send_chunk + 1) * c]
        if j == 0:
            want, what = chunk, "its own chunk"
        elif j <= n - 1:
            want, what = chunk + received[j - 1], f"its own chunk + the message received at step {j - 1}"
        else:
            want, what = received[j - 1], f"the message received at step {j - 1}"
        same = sent[j].dtype == want.dtype and torch.equal(sent[j], want)
        require(same, "send-not-after-receive", f"rank {rank}: step {j} sent {sent[j][:4].tolist()}..., not {what} "
                f"({want[:4].tolist()}...)", rank=rank, step=j, carries=what)  # fmt: skip
        carries.append(what)
    return carries


def _check_wire(sent_by_rank: list[list[torch.Tensor]], received: list[torch.Tensor], rank: int) -> None:
    """What this rank received at each step is what its left neighbour sent at that step."""
    left = sent_by_rank[(rank - 1) % len(sent_by_rank)]
    for j, (got, posted) in enumerate(zip(received, left, strict=True)):
        require(torch.equal(got, posted), "wire-differs", f"rank {rank}: step {j} received not what the left "
                "neighbour sent", rank=rank, step=j)  # fmt: skip


def takes_2n_minus_1_steps(ctx: RankContext, numel: int) -> dict[str, Any]:
    """The ring takes exactly 2(N−1) steps, each one message each way of one chunk, on the model's schedule, and
    every step's send carries what the previous step received (`_check_dependency`, on the messages handed to
    ``dist.isend`` and filled by ``dist.irecv``), so no step's send can be posted before the step before it has
    arrived: one chain of 2(N−1) dependent messages, also across ranks (`_check_wire`)."""
    example = {"numel": numel, "dtype": "float32", "seed": 0}
    values = rank_values(example, ctx.rank)
    own = torch.nn.functional.pad(values.clone(), [0, model.padding_numel(numel, ctx.world_size)])
    with record_comm() as comm, posted_messages() as seen:
        traffic = ring.ring_all_reduce(values)
    ctx.agreed(_check_steps, traffic, comm, numel)
    carries = ctx.agreed(_check_dependency, seen, own, ctx.rank, ctx.world_size)
    ctx.agreed(_check_wire, ctx.gather(seen["sent"]), seen["received"], ctx.rank)
    ctx.agreed(
        partial(_require_same, reason="wrong-sum", what="the sum"), values, expected_sum(example, ctx.world_size)
    )
    return {
        "steps": len(traffic.steps),
        "schedule": [list(s.as_tuple()) for s in traffic.steps],
        "owned_chunk": traffic.steps[ctx.world_size - 2].recv_chunk,
        "messages_sent": traffic.messages_sent,
        "chunk_numel": traffic.chunk_numel,
        "each_send_carries": carries,
    }


# -- (4) the naive all-reduce overloads rank 0 ----------------------------------------------------------------------
def _check_naive(naive_seen: list[dict[str, int]], ring_seen: list[dict[str, int]], nbytes: int) -> None:
    n = len(naive_seen)
    bound = model.ring_bytes("all_reduce", nbytes, n)
    for rank, seen in enumerate(naive_seen):
        want = model.naive_rank_bytes(nbytes, rank, n)
        for key, expected in (("sent_bytes", want.sent), ("dispatcher_sent_bytes", want.sent)):
            require_equal(seen[key], expected, reason="naive-bytes-differ", what=f"naive rank {rank}: {key}")
        for key in ("received_bytes", "dispatcher_received_bytes"):
            require_equal(seen[key], want.received, reason="naive-bytes-differ", what=f"naive rank {rank}: {key}")
    require(
        naive_seen[0]["dispatcher_sent_bytes"] > bound,
        "naive-within-bound",
        f"the naive all-reduce's rank 0 sent {naive_seen[0]['dispatcher_sent_bytes']} bytes, within the bound {bound}",
    )
    for rank, seen in enumerate(ring_seen):
        require(
            seen["dispatcher_sent_bytes"] <= bound,
            "ring-over-bound",
            f"the ring's rank {rank} sent {seen['dispatcher_sent_bytes']} bytes, over the bound {bound}",
            rank=rank,
            observed=seen["dispatcher_sent_bytes"],
        )


def naive_overloads_rank_0(ctx: RankContext, numel: int) -> dict[str, Any]:
    """The naive all-reduce sums correctly, but rank 0 sends and receives (N−1)·S, more than the bound 2(N−1)/N·S
    once N > 2; the ring's every rank sends the bound (N divides the size here: no padding)."""
    example = {"numel": numel, "dtype": "float32", "seed": 1}
    nbytes = numel * ITEMSIZE["float32"]
    values = rank_values(example, ctx.rank)
    by_naive, by_ring = values.clone(), values.clone()
    with record_comm() as naive_comm:
        naive_traffic = naive.naive_all_reduce(by_naive)
    with record_comm() as ring_comm:
        ring_traffic = ring.ring_all_reduce(by_ring)
    want = expected_sum(example, ctx.world_size)
    ctx.agreed(partial(_require_same, reason="naive-wrong-sum", what="the naive sum"), by_naive, want)
    ctx.agreed(partial(_require_same, reason="wrong-sum", what="the ring's sum"), by_ring, want)
    naive_seen = ctx.gather(_measured(naive_traffic, naive_comm))
    ring_seen = ctx.gather(_measured(ring_traffic, ring_comm))
    ctx.agreed(_check_naive, naive_seen, ring_seen, nbytes)
    bound = model.ring_bytes("all_reduce", nbytes, ctx.world_size)
    return {
        "nbytes": nbytes,
        "bound_bytes": float(bound),
        "naive_sent_bytes": [s["dispatcher_sent_bytes"] for s in naive_seen],
        "naive_received_bytes": [s["dispatcher_received_bytes"] for s in naive_seen],
        "ring_sent_bytes": [s["dispatcher_sent_bytes"] for s in ring_seen],
        "rank0_over_bound": float(Fraction(naive_seen[0]["dispatcher_sent_bytes"]) / bound),
    }


# -- break-it recipes (tests/break_it/test_14_ring_all_reduce.py) ---------------------------------------------------
def skip_last_reduce_scatter_step(original: Any, buffer: Any, c: int, k: int, traffic: Traffic) -> None:
    """A ring that forgets reduce-scatter step N−2 (on every rank, so no rank waits for a message never sent)."""
    if k == traffic.world_size - 2:
        return None
    return original(buffer, c, k, traffic)


def skip_first_all_gather_step(original: Any, buffer: Any, c: int, k: int, traffic: Traffic) -> None:
    """A ring whose all-gather starts one step late: its first step is skipped on every rank."""
    if k == 0:
        return None
    return original(buffer, c, k, traffic)


def send_the_next_chunk(original: Any, phase: str, rank: int, k: int, world_size: int) -> tuple[int, int]:
    """A ring whose reduce-scatter sends chunk i − k + 1 where the seed says i − k (the receiver still files it
    under i − 1 − k)."""
    send, recv = original(phase, rank, k, world_size)
    if phase == ring.REDUCE_SCATTER:
        return (send + 1) % world_size, recv
    return send, recv


def ring_of_independent_messages(original: Any, tensor: torch.Tensor) -> Traffic:
    """``ring_all_reduce`` replaced by a ring that records the seed's schedule and sends one chunk each way per
    step, but every message is the chunk as it was before any step ran: no send waits for a receive. Its sum comes
    from ``dist.all_reduce``, so the sum, the steps it records and the messages' sizes are all right."""
    rank, n = dist.get_rank(), dist.get_world_size()
    numel = tensor.numel()
    c = ring.chunk_size(numel, n)
    traffic = Traffic(rank, n, chunk_numel=c, padding_numel=n * c - numel)
    before = torch.zeros(n * c, dtype=tensor.dtype)
    before[:numel].copy_(tensor.reshape(-1))
    for phase in (ring.REDUCE_SCATTER, ring.ALL_GATHER):
        for k in range(n - 1):
            send, recv = ring.chunks_to_exchange(phase, rank, k, n)
            ring.exchange(before[send * c : (send + 1) * c].clone(), torch.empty(c, dtype=tensor.dtype), traffic)
            traffic.steps.append(StepRecord(phase, k, send, recv, c))
    dist.all_reduce(tensor)
    return traffic


def one_element_more_per_chunk(original: Any, numel: int, world_size: int) -> int:
    """A ring that pads every chunk by one element more than it needs: the sum is still right, the bytes not."""
    return original(numel, world_size) + 1


def naive_is_the_ring(original: Any, tensor: torch.Tensor) -> Traffic:
    """The naive all-reduce replaced by the ring: rank 0 is no longer overloaded."""
    return ring.ring_all_reduce(tensor)
