"""What each torch collective operator means: its kind, its full payload, and the ring model's bytes per rank;
and `Collective`, the record of one collective a rank issued (`checks.probes.comm` records them).

Every Python collective API (``dist.all_gather_single``, the deprecated ``all_gather_into_tensor``, the private
``_all_gather_base``, the list ``all_gather``, coalesced variants, object collectives) and every C++ caller
(DDP's reducer) ends in one of the dispatcher operators below (``c10d::*``), and functional collectives (DTensor)
in ``_c10d_functional::*``. Recording at that layer does not depend on which API name torch uses.

Payload ``S`` is the full, unsharded size of one collective: the tensor of an all-reduce or broadcast, the
*output* of an all-gather, the *input* of a reduce-scatter, the input of an all-to-all, the gathered total of a
gather or scatter. Bytes sent per rank under the ring model (the textbook model, not gloo's or NCCL's wire bytes):

==================  ==================  ===================================================================
all_reduce          2(N−1)/N · S        ring reduce-scatter then ring all-gather
all_gather          (N−1)/N · S         each rank forwards N−1 of the N chunks
reduce_scatter      (N−1)/N · S         mirror of all-gather
broadcast, reduce   (N−1)/N · S         pipelined chain: N−1 ranks each send S; averaged over N ranks
all_to_all          (N−1)/N · S         each rank sends every chunk but its own
gather, scatter     (N−1)/N² · S        N−1 ranks send (or receive) one S/N chunk; averaged over N ranks
send / recv         S / 0               this rank's own bytes
barrier             0
==================  ==================  ===================================================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

# Kinds of collective, in the order tables list them.
KINDS: tuple[str, ...] = (
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "gather", "scatter",
    "send", "recv", "barrier",
)  # fmt: skip

# Operators in these namespaces that move no data (waits, autograd wrappers, NaN checks).
NON_COMMUNICATING = frozenset(
    {"_c10d_functional::wait_tensor", "_c10d_functional::_wrap_tensor_autograd", "c10d::check_for_nan"}
)
NAMESPACES = frozenset({"c10d", "_c10d_functional", "_c10d_functional_autograd", "_dtensor"})


@dataclass(frozen=True)
class Payload:
    """What one operator call moves: the full payload's tensors and the group it runs on."""

    kind: str
    tensors: tuple[torch.Tensor, ...]  # the full (unsharded) payload, possibly several for coalesced calls
    per_rank: bool  # the tensors are this rank's contribution only: the full payload is N times their size
    count: int  # how many tensors the call coalesces
    group: Any  # ProcessGroup, a ScriptObject wrapping one, or a group name
    async_op: bool
    sent_bytes_p2p: int | None = None  # for batched point-to-point: the bytes of its sends


def ring_bytes(kind: str, nbytes: int, group_size: int) -> float:
    """Bytes this rank sends for a collective of ``nbytes`` full payload under the model in the module docstring."""
    n = group_size
    if n <= 1 or kind in ("barrier", "recv"):
        return 0.0
    if kind == "all_reduce":
        return 2 * (n - 1) * nbytes / n
    if kind in ("all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"):
        return (n - 1) * nbytes / n
    if kind in ("gather", "scatter"):
        return (n - 1) * nbytes / (n * n)
    if kind == "send":
        return float(nbytes)
    raise ValueError(f"no ring model for {kind!r}")


def bind(func: torch._ops.OpOverload, args: Sequence[Any], kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The operator's arguments by schema name, defaults filled in."""
    schema = func._schema.arguments
    bound = dict(zip((a.name for a in schema), args, strict=False))
    bound.update(kwargs or {})
    for argument in schema:
        if argument.name not in bound and argument.has_default_value():
            bound[argument.name] = argument.default_value
    return bound


def _flat(values: Iterable[Any]) -> tuple[torch.Tensor, ...]:
    out: list[torch.Tensor] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, list | tuple):
            out.extend(_flat(value))
    return tuple(out)


def _one(name: str) -> Callable[[dict[str, Any]], tuple[torch.Tensor, ...]]:
    return lambda b: _flat([b[name]])


_Rule = tuple[str, Callable[[dict[str, Any]], tuple[torch.Tensor, ...]], str, str]

# name -> (kind, payload tensors, argument whose length is the coalesced count, "1": they are the full payload, or
# "group": they are one rank's part of it)
_RULES: dict[str, _Rule] = {
    "c10d::allreduce_": ("all_reduce", _one("tensors"), "tensors", "1"),
    "c10d::allreduce_coalesced_": ("all_reduce", _one("tensors"), "tensors", "1"),
    "c10d::_allgather_base_": ("all_gather", _one("output_tensor"), "", "1"),
    "c10d::allgather_": ("all_gather", _one("output_tensors"), "input_tensors", "1"),
    "c10d::allgather_coalesced_": ("all_gather", _one("output_lists"), "input_list", "1"),
    "c10d::allgather_into_tensor_coalesced_": ("all_gather", _one("outputs"), "outputs", "1"),
    "c10d::_reduce_scatter_base_": ("reduce_scatter", _one("input_tensor"), "", "1"),
    "c10d::reduce_scatter_": ("reduce_scatter", _one("input_tensors"), "output_tensors", "1"),
    "c10d::reduce_scatter_tensor_coalesced_": ("reduce_scatter", _one("inputs"), "inputs", "1"),
    "c10d::broadcast_": ("broadcast", _one("tensors"), "tensors", "1"),
    "c10d::reduce_": ("reduce", _one("tensors"), "tensors", "1"),
    "c10d::gather_": ("gather", _one("input_tensors"), "input_tensors", "group"),
    "c10d::scatter_": ("scatter", _one("output_tensors"), "output_tensors", "group"),
    "c10d::alltoall_base_": ("all_to_all", _one("input"), "", "1"),
    "c10d::alltoall_": ("all_to_all", _one("input_tensors"), "", "1"),
    "c10d::barrier": ("barrier", lambda b: (), "", "1"),
    "c10d::monitored_barrier_": ("barrier", lambda b: (), "", "1"),
    "c10d::send": ("send", _one("tensors"), "tensors", "1"),
    "c10d::recv_": ("recv", _one("tensors"), "tensors", "1"),
    "c10d::recv_any_source_": ("recv", _one("tensors"), "tensors", "1"),
    "_c10d_functional::all_reduce": ("all_reduce", _one("input"), "", "1"),
    "_c10d_functional::all_reduce_": ("all_reduce", _one("input"), "", "1"),
    "_c10d_functional::all_reduce_coalesced": ("all_reduce", _one("inputs"), "inputs", "1"),
    "_c10d_functional::all_reduce_coalesced_": ("all_reduce", _one("inputs"), "inputs", "1"),
    "_c10d_functional::all_gather_into_tensor": ("all_gather", _one("input"), "", "group"),
    "_c10d_functional::all_gather_into_tensor_out": ("all_gather", _one("input"), "", "group"),
    "_c10d_functional_autograd::all_gather_into_tensor": ("all_gather", _one("input"), "", "group"),
    "_c10d_functional::all_gather_into_tensor_coalesced": ("all_gather", _one("inputs"), "inputs", "group"),
    "_c10d_functional::reduce_scatter_tensor": ("reduce_scatter", _one("input"), "", "1"),
    "_c10d_functional::reduce_scatter_tensor_out": ("reduce_scatter", _one("input"), "", "1"),
    "_c10d_functional_autograd::reduce_scatter_tensor": ("reduce_scatter", _one("input"), "", "1"),
    "_c10d_functional::reduce_scatter_tensor_coalesced": ("reduce_scatter", _one("inputs"), "inputs", "1"),
    "_c10d_functional::all_to_all_single": ("all_to_all", _one("input"), "", "1"),
    "_c10d_functional_autograd::all_to_all_single": ("all_to_all", _one("input"), "", "1"),
    "_dtensor::shard_dim_alltoall": ("all_to_all", _one("input"), "", "1"),
    "_c10d_functional::broadcast": ("broadcast", _one("input"), "", "1"),
    "_c10d_functional::broadcast_": ("broadcast", _one("input"), "", "1"),
    "_c10d_functional::isend": ("send", _one("tensor"), "", "1"),
    "_c10d_functional::irecv": ("recv", _one("tensor"), "", "1"),
}


def is_collective(name: str) -> bool:
    """Whether a dispatcher operator name (``"c10d::allreduce_"``) is one the recorder must account for."""
    return name.split("::", 1)[0] in NAMESPACES and name not in NON_COMMUNICATING


def modelled(name: str) -> bool:
    return name in _RULES or name == "_c10d_functional::batch_p2p_ops"


def payload(name: str, bound: dict[str, Any]) -> Payload:
    """Interpret one call. An operator this table does not know is still returned (kind ``unknown``) so that a
    new torch collective is reported, never dropped."""
    group = bound.get("process_group", bound.get("group_name"))
    async_op = bool(bound.get("async_op", True))  # functional collectives are always asynchronous
    if name == "_c10d_functional::batch_p2p_ops":
        tensors = _flat([bound["tensors"]])
        sent = sum(_nbytes(t) for t, op in zip(tensors, bound["op_list"], strict=False) if "send" in op)
        return Payload("send", tensors, False, len(tensors), group, True, sent_bytes_p2p=sent)
    rule = _RULES.get(name)
    if rule is None:
        tensors = _flat(bound.values())
        return Payload(f"unknown:{name}", tensors, False, len(tensors), group, async_op)
    kind, full, count_of, scale = rule
    tensors = full(bound)
    count = len(_flat([bound[count_of]])) if count_of else 1
    return Payload(kind, tensors, scale == "group", count, group, async_op)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass(frozen=True)
class Collective:
    """One collective as this rank issued it. Plain data: returnable from a rank, comparable across ranks
    through `key` (which leaves out the rank and the sequence number)."""

    index: int  # position in this recording, from 1
    op: str  # all_reduce | all_gather | reduce_scatter | broadcast | reduce | all_to_all | gather | scatter | ...
    torch_op: str  # dispatcher operator, e.g. "c10d::_allgather_base_"
    api: str  # Python API the caller used ("all_gather_single", "funcol.all_reduce"), or "<C++>"
    caller: str  # nearest frame outside the plumbing, "module:qualname"
    dtype: str  # "torch.float32", "mixed", or "" for a barrier
    numel: int  # elements of the full payload S
    nbytes: int  # bytes of the full payload S
    ring_bytes: float  # bytes this rank sends under the ring model
    group_size: int
    group_ranks: tuple[int, ...]
    backend: str  # the group's backend, "gloo" / "nccl"
    numels: tuple[int, ...] = ()  # elements of each tensor of the full payload (list and coalesced forms)
    tensors: int = 1  # how many tensors one call coalesces
    async_op: bool = False
    object_collective: bool = False
    in_backward: bool = False
    rank: int = -1
    seq: int = 0
    source: str = ""  # captured checks only: the caller's line, "torch/distributed/fsdp/_flat_param.py:1390"
    # The data pointer of each payload tensor's storage (this rank's addresses: left out of `key`), so a check can
    # tell which tensors a collective moved, e.g. that DDP all-reduces the very storage its gradients view.
    storages: tuple[int, ...] = ()
    # A send's destination or a receive's source, as a global rank (-1 for collectives and any-source receives):
    # which neighbour a pipeline stage sent an activation to. Left out of `key`: the two ends differ by design.
    peer: int = -1

    def key(self) -> tuple[Any, ...]:
        return (
            self.index, self.op, self.torch_op, self.api, self.caller, self.dtype, self.numel, self.group_size,
            self.group_ranks, self.numels, self.object_collective, self.in_backward,
        )  # fmt: skip

    def describe(self) -> str:
        return f"{self.op} {self.numel} × {self.dtype.removeprefix('torch.')} via {self.api} from {self.caller}"
