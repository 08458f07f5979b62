"""The comm recorder's independent witness: the communication backend's own profiler events.

Every gloo / NCCL work item opens a profiler range named ``"<backend>:<op>"`` (``gloo:all_gather``) with its input
shapes, wherever the call came from: Python, C++ (DDP's reducer), or a handle on the backend object that never
passes through the dispatcher. This module collects those events while the recorder runs and explains each one
by a recorded collective. An event no record explains is a collective that ran unrecorded; a record with no event
is one the backend did not run as recorded. Either fails the recording.

The model of which events a collective produces is backend-specific and was measured on torch 2.13 / gloo:

- reduce-scatter is an all-reduce of the full input plus a local copy (``gloo:all_reduce`` of S elements); the
  list form ``dist.reduce_scatter`` is N all-reduces of S/N; a coalesced reduce-scatter is one all-reduce per
  tensor. So assert logical / ring-model bytes from the records, never gloo's wire bytes.
- an all-gather's event carries this rank's input (S/N elements, summed over coalesced tensors);
- all-reduce, broadcast and reduce carry the full tensor(s); the others (gather, scatter, all-to-all, send,
  recv, barrier) are matched by count.

NCCL's model is written from torch's source (one ``nccl:*`` event per collective) and matched by count only;
it is unmeasured here, and a mismatch on NCCL says so.

Only the profiler's user-scope ranges are collected, on every thread (a private torch API; the public
``torch.profiler`` is the fallback, which sees only this thread and its children), so the witness costs little even
around a real training step and sees a collective issued from a Python thread the recorder does not cover.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from math import prod
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from checks.probes.collectives import Collective

BACKENDS = ("gloo", "nccl", "ucc", "mpi", "xccl")
_NCCL_NAMES: dict[str, tuple[str, ...]] = {  # event names (after "nccl:") NCCL may use for each kind
    "all_reduce": ("all_reduce", "allreduce", "all_reduce_coalesced", "allreduce_coalesced"),
    "all_gather": ("all_gather", "_all_gather_base", "allgather", "all_gather_into_tensor_coalesced"),
    "reduce_scatter": ("reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced"),
    "broadcast": ("broadcast",),
    "reduce": ("reduce",),
    "all_to_all": ("all_to_all", "all_to_allv", "alltoall", "alltoall_base"),
    "gather": ("gather",),
    "scatter": ("scatter",),
    "send": ("send",),
    "recv": ("recv",),
    "barrier": ("barrier", "all_reduce"),
}
_LIST_REDUCE_SCATTER = "c10d::reduce_scatter_"
_COALESCED_REDUCE_SCATTER = (
    "c10d::reduce_scatter_tensor_coalesced_",
    "_c10d_functional::reduce_scatter_tensor_coalesced",
)


@dataclass(frozen=True)
class BackendEvent:
    backend: str  # "gloo"
    name: str  # "all_gather"
    numel: int  # elements of the event's input shapes


@dataclass(frozen=True)
class ExpectedEvent:
    backend: str
    names: tuple[str, ...]  # any of these names
    numel: int | None  # None: matched by count only
    because: str  # the record that predicts it, as text


@dataclass
class CrossCheck:
    """The comparison of the recorded collectives with the backend's events."""

    method: str  # how the events were collected
    observed: list[BackendEvent] = field(default_factory=list)
    unrecorded: list[BackendEvent] = field(default_factory=list)  # events no record explains
    unseen: list[ExpectedEvent] = field(default_factory=list)  # predicted events the backend did not show
    unmodelled: list[str] = field(default_factory=list)  # records of operators the recorder has no model for
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.unrecorded or self.unseen or self.unmodelled)

    def explain(self) -> str:
        lines = [f"comm recorder cross-check against backend profiler events ({self.method}):"]
        lines += [f"  ran but not recorded: {e.backend}:{e.name} ({e.numel} elements)" for e in self.unrecorded]
        lines += [
            f"  recorded but the backend showed no {'/'.join(e.names)}"
            f"{'' if e.numel is None else f' of {e.numel} elements'}: {e.because}"
            for e in self.unseen
        ]
        lines += [f"  recorded an operator with no model: {name}" for name in self.unmodelled]
        lines += [f"  note: {note}" for note in self.notes]
        if self.ok:
            lines.append(f"  ok: {len(self.observed)} backend events, each explained by a record")
        return "\n".join(lines)


def expected_events(record: Collective) -> list[ExpectedEvent]:
    """The backend events one recorded collective should produce (see the module docstring)."""
    backend, kind, n = record.backend, record.op, max(record.group_size, 1)
    because = f"#{record.index} {record.op} via {record.api} from {record.caller}"
    if backend == "gloo":
        if kind == "reduce_scatter":
            if record.torch_op == _LIST_REDUCE_SCATTER:
                return [ExpectedEvent("gloo", ("all_reduce",), record.numel // n, because)] * n
            if record.torch_op in _COALESCED_REDUCE_SCATTER:
                return [ExpectedEvent("gloo", ("all_reduce",), m, because) for m in record.numels]
            return [ExpectedEvent("gloo", ("all_reduce",), record.numel, because)]
        if kind == "all_gather":
            return [ExpectedEvent("gloo", ("all_gather",), record.numel // n, because)]
        if kind in ("all_reduce", "broadcast", "reduce"):
            return [ExpectedEvent("gloo", (kind,), record.numel, because)]
        return [ExpectedEvent("gloo", (kind,), None, because)]
    names = _NCCL_NAMES.get(kind, (kind,))
    return [ExpectedEvent(backend, names, None, because)]


def compare(records: list[Collective], observed: list[BackendEvent], method: str) -> CrossCheck:
    result = CrossCheck(method=method, observed=list(observed))
    expected: list[ExpectedEvent] = []
    for record in records:
        if record.op.startswith("unknown:"):
            result.unmodelled.append(f"{record.torch_op} via {record.api} from {record.caller}")
            continue
        expected.extend(expected_events(record))
    remaining = Counter((e.backend, e.name, e.numel) for e in observed)
    # Size-checked predictions first, so a count-only one cannot take an event a sized one needs.
    for event in sorted(expected, key=lambda e: e.numel is None):
        match = next(
            (
                key
                for key, left in remaining.items()
                if left > 0 and key[0] == event.backend and key[1] in event.names
                if event.numel is None or key[2] == event.numel
            ),
            None,
        )
        if match is None:
            result.unseen.append(event)
        else:
            remaining[match] -= 1
    result.unrecorded = [BackendEvent(*key) for key, left in remaining.items() for _ in range(left)]
    if any(e.backend != "gloo" for e in expected) and not result.ok:
        result.notes.append("the NCCL event model is written from torch's source and unmeasured on this machine")
    return result


def _parse(name: str, shapes: list[list[int]]) -> BackendEvent | None:
    backend, sep, op = name.partition(":")
    if not sep or backend not in BACKENDS:
        return None
    return BackendEvent(backend, op, sum(prod(s) for s in shapes if s is not None))


class BackendEvents:
    """Context manager: collects the backend's collective events while it is open (``events`` after exit)."""

    def __init__(self) -> None:
        self.events: list[BackendEvent] = []
        self.method = ""
        self._exit: contextlib.ExitStack | None = None

    def __enter__(self) -> BackendEvents:
        if getattr(torch.autograd.profiler, "_is_profiler_enabled", False) or torch._C._autograd._profiler_enabled():
            raise RuntimeError(
                "record_comm's cross-check needs torch's profiler, which is already running in this rank; pass "
                "crosscheck=False to record without it (and say in the claim that the recording is unwitnessed)"
            )
        self._exit = contextlib.ExitStack()
        try:
            self._exit.enter_context(self._user_scope())
            self.method = "profiler, user-scope ranges only"
        except (ImportError, AttributeError, TypeError, RuntimeError):  # the private API moved: use the public one
            self._exit.enter_context(self._public())
            self.method = "torch.profiler.profile"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._exit is not None
        self._exit.close()

    @contextlib.contextmanager
    def _user_scope(self) -> Iterator[None]:
        from torch._C._profiler import RecordScope, _ExperimentalConfig
        from torch.autograd.profiler import (
            ProfilerActivity,
            ProfilerConfig,
            ProfilerState,
            _disable_profiler,
            _enable_profiler,
            _prepare_profiler,
            _run_on_profiler_start,
            _run_on_profiler_stop,
        )

        config = ProfilerConfig(
            ProfilerState.KINETO, True, False, False, False, False, _ExperimentalConfig(profile_all_threads=True)
        )
        activities = {ProfilerActivity.CPU}
        _prepare_profiler(config, activities)
        _enable_profiler(config, activities, {RecordScope.USER_SCOPE})  # type: ignore[call-arg]
        _run_on_profiler_start()  # what torch.profiler does too: others can see a profiler is running
        try:
            yield
        finally:
            _run_on_profiler_stop()
            result = _disable_profiler()
            for event in result.events():
                name = event.name()
                if name.partition(":")[0] in BACKENDS:  # shapes are converted only for the few backend events
                    parsed = _parse(name, event.shapes())
                    if parsed is not None:
                        self.events.append(parsed)

    @contextlib.contextmanager
    def _public(self) -> Iterator[None]:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            yield
        for event in prof.events():
            parsed = _parse(event.name, event.input_shapes or [])
            if parsed is not None:
                self.events.append(parsed)
