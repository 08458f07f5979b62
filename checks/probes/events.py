"""Record what FSDP does, in order, on this rank: ``with record_events(model) as events: ...``.

Events (kind: meaning):

- ``root_pre_forward``: the root's pre-forward logic ran (start of a forward pass).
- ``unshard``: FSDP issued an unshard of a unit for its own use (FSDP1 ``_unshard``; FSDP2
  ``FSDPParamGroup.unshard`` that started an all-gather). ``detail`` says whether FSDP1's unshard all-gathers
  (``"all-gather"``) or finds the parameter already unsharded / unsharded by strategy (``"no all-gather"``).
- ``prefetch``: an unshard issued ahead of time: ``fqn`` is the unit whose hook issued it, ``target`` the unit
  it unshards, ``state`` the issuer's training state (BACKWARD_PRE / BACKWARD_POST / FORWARD ...).
- ``wait_unshard`` (FSDP2): a unit waits for its issued all-gather and copies it out (with a prefetch, this is
  where the overlap ends).
- ``free``: a reshard that frees the unsharded parameter; ``reshard``: one that keeps it (FSDP1
  ``_reshard(free_unsharded_flat_param=False)``, or FSDP2's reshard to the post-forward mesh).
- ``pre_backward`` / ``post_backward``: the unit's backward hooks (once per unit per backward; FSDP1 runs the
  pre-backward hook once per output tensor and only the first run does anything, so only that one is recorded).
- ``reduce_grad``: the unit's gradient reduction was issued; ``detail`` names the collective(s).
- ``final_callback``: the root's post-backward final callback; the iteration ends when it returns.

Each event has the unit's module FQN (root = ``""``, FSDP1 wrapper prefixes removed), the unit's training state
when the event began (FSDP1 ``HandleTrainingState``, FSDP2 ``TrainingState`` names), the iteration (1 until the
first final callback returns, then 2, ...), the rank, and ``seq`` from the clock shared with the comm recorder.
`FsdpEvent.key` leaves out the rank and ``seq`` so that logs compare across ranks.

How: FSDP1 registers its hooks as ``functools.partial`` objects that hold the functions at wrap time, so patching
module attributes after wrapping would miss them. The recorder observes the functions' code objects instead,
through the trace multiplexer of `checks.tracing` (it coexists with the runtime evidence of ``watch``), and reads
the frame's arguments (state, handle, param group). Frames whose outcome matters (did this FSDP2 ``unshard`` start
an all-gather?) are also observed at return. Backward runs on the calling thread while recording
(``torch.autograd.set_multithreading_enabled(False)``): on GPU, autograd's device threads would otherwise run the
backward hooks where no Python trace function reaches.

Blind spots: FSDP code outside the observed functions (``summon_full_params``, state-dict hooks) records only
what it does through them; FSDP1 units without parameters (a root with no handle) record no pre-backward event;
FQNs need ``model`` unless the recording sees the root's pre-forward (FSDP1) or FSDP2 has lazily initialised (its
param groups know their FQN); FSDP1's composable ``fully_shard`` states are not modules, so their FQNs need
``model``. The observed functions are resolved when a recording starts: one a new torch renamed fails loudly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from checks import tracing
from checks.probes import clock

ROOT = ""
_WRAPPER_NAMES = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})


@dataclass(frozen=True)
class FsdpEvent:
    index: int  # position in this recording, from 1
    iteration: int
    kind: str
    fqn: str
    state: str
    target: str | None = None
    detail: str = ""
    api: str = ""  # "fsdp1" | "fsdp2"
    rank: int = -1
    seq: int = 0

    def key(self) -> tuple[Any, ...]:
        return (self.index, self.iteration, self.kind, self.fqn, self.state, self.target, self.detail)

    def describe(self) -> str:
        """Compact text used in expected-vs-observed sequences, e.g. ``prefetch (root)→2``, ``free 1``."""
        if self.kind == "prefetch":
            return f"prefetch {show(self.fqn)}→{show(self.target or '')}"
        return f"{self.kind} {show(self.fqn)}"


def show(fqn: str) -> str:
    return "(root)" if fqn == ROOT else fqn


@dataclass
class EventLog:
    """What `record_events` recorded on one rank."""

    rank: int = -1
    world_size: int = 0
    events: list[FsdpEvent] = field(default_factory=list)
    completed_iterations: int = 0
    notes: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[FsdpEvent]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def __getitem__(self, index: int) -> FsdpEvent:
        return self.events[index]

    def select(
        self, kind: str | tuple[str, ...] | None = None, *, iteration: int | None = None, fqn: str | None = None
    ) -> list[FsdpEvent]:
        kinds = (kind,) if isinstance(kind, str) else kind
        return [
            e
            for e in self.events
            if (kinds is None or e.kind in kinds)
            and (iteration is None or e.iteration == iteration)
            and (fqn is None or e.fqn == fqn)
        ]

    def sequence(self, kinds: str | tuple[str, ...] | None = None, *, iteration: int | None = None) -> list[str]:
        """`FsdpEvent.describe` of the selected events, in order: what expected sequences are written in."""
        return [e.describe() for e in self.select(kinds, iteration=iteration)]

    def prefetches(self, iteration: int | None = None) -> list[tuple[str, str]]:
        """(issuer FQN, target FQN) of every prefetch, in order."""
        return [(e.fqn, e.target or "") for e in self.select("prefetch", iteration=iteration)]

    def keys(self) -> list[tuple[Any, ...]]:
        return [e.key() for e in self.events]


class RecorderFailed(AssertionError):
    """A recorder's own hook failed: its recording cannot be trusted."""


def clean_fqn(name: str) -> str:
    return ".".join(part for part in name.split(".") if part and part not in _WRAPPER_NAMES)


class Recording:
    """The state hooks write into: pending events, the iteration counter, module FQNs."""

    def __init__(self, model: nn.Module | None, rank: int) -> None:
        self.rank = rank
        self.iteration = 1
        self.pending: list[tuple[int, int, str, str, str, str | None, str, str]] = []
        self.notes: list[str] = []
        self._fqns: dict[int, str] = {}
        self._roots: list[nn.Module] = []
        if model is not None:
            self.add_root(model)

    def add_root(self, module: nn.Module) -> None:
        if any(module is root for root in self._roots):
            return
        self._roots.append(module)
        for name, sub in module.named_modules():
            self._fqns.setdefault(id(sub), clean_fqn(name))

    def fqn(self, module: nn.Module | None) -> str:
        if module is None:
            return "?"
        found = self._fqns.get(id(module))
        if found is None:
            found = f"<{type(module).__name__}>"
            note = f"no FQN for a {type(module).__name__}: pass the model to record_events"
            if note not in self.notes:
                self.notes.append(note)
        return found

    def emit(
        self,
        kind: str,
        fqn: str,
        state: str,
        *,
        api: str,
        target: str | None = None,
        detail: str = "",
        seq: int | None = None,
        iteration: int | None = None,
    ) -> None:
        self.pending.append(
            (
                clock.tick() if seq is None else seq,
                self.iteration if iteration is None else iteration,
                kind,
                fqn,
                state,
                target,
                detail,
                api,
            )
        )

    def finish(self) -> list[FsdpEvent]:
        ordered = sorted(self.pending, key=lambda p: p[0])  # return-time events were stamped at call time
        return [
            FsdpEvent(i, iteration, kind, fqn, state, target, detail, api, self.rank, seq)
            for i, (seq, iteration, kind, fqn, state, target, detail, api) in enumerate(ordered, start=1)
        ]


@contextmanager
def record_events(model: nn.Module | None = None) -> Iterator[EventLog]:
    """Record FSDP1 and FSDP2 events in the block (see the module docstring). ``model``: the root module, for
    FQNs. Raises `RecorderFailed` at exit if one of its hooks failed."""
    from checks.probes import fsdp_hooks

    rank = dist.get_rank() if dist.is_initialized() else 0
    log = EventLog(rank=rank, world_size=dist.get_world_size() if dist.is_initialized() else 1)
    recording = Recording(model, rank)
    hooks = fsdp_hooks.hook_table(recording)
    with torch.autograd.set_multithreading_enabled(False), tracing.subscribed(hooks) as subscription:
        try:
            yield log
        finally:
            log.events = recording.finish()
            log.completed_iterations = recording.iteration - 1
            log.notes = recording.notes
    if subscription.errors:
        error = subscription.errors[0]
        raise RecorderFailed(f"the FSDP event recorder's hook failed, so its events are incomplete: {error!r}") from (
            error
        )
