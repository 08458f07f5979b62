"""Probes a check uses inside its rank: collectives, FSDP events and per-rank memory, as plain picklable records.

Three lines record one training step::

    with record_comm() as comm, record_events(model) as events, account_memory(model, optim) as mem:
        loss = model(x).sum(); loss.backward(); optim.step()

or, the same in one line, ``with record_step(model, optim) as step:`` (``step.comm``, ``step.events``,
``step.memory``). Every record can be returned from the rank and compared across ranks (``.keys()``).

- `record_comm` (`checks.probes.comm`): every collective at the dispatcher (a kernel at the collective operators'
  Autograd key), any API name, C++ callers included, witnessed by the backend's own profiler events
  (`checks.probes.crosscheck`).
- `record_events` (`checks.probes.events`, `checks.probes.fsdp_hooks`): FSDP1 and FSDP2 unshard / prefetch /
  reshard / hooks / gradient reduction / final callback, by swapping the observed functions' code for
  trampolines (`checks.probes.calls`; no trace function).
- `account_memory` (`checks.probes.memory`, `checks.probes.peaks`): bytes per category from distinct live
  storages; peaks from torch's memory trackers when asked (``peaks=True``: a dispatch mode, several times the
  step); CUDA allocator stats on GPU.

What each costs on a step: ``pytest benchmarks/test_probes_overhead.py`` (ratios to a bare step in its
``extra_info``); where the time goes: ``checks.probes.selftest:mini_gpt_profile`` (cProfile of probed steps).
- `checks.probes.render`: rich tables for failure messages and the terminal; `checks.probes.expect`: assertions
  that fail with them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from checks.probes.comm import Collective, CommLog, UnrecordedCollectives, record_comm
from checks.probes.events import EventLog, FsdpEvent, RecorderFailed, record_events
from checks.probes.expect import SequenceMismatch, assert_sequence
from checks.probes.memory import MemoryAccount, MemorySnapshot, account_memory, snapshot

__all__ = [
    "Collective",
    "CommLog",
    "EventLog",
    "FsdpEvent",
    "MemoryAccount",
    "MemorySnapshot",
    "RecorderFailed",
    "SequenceMismatch",
    "StepRecord",
    "UnrecordedCollectives",
    "account_memory",
    "assert_sequence",
    "record_comm",
    "record_events",
    "record_step",
    "snapshot",
]


@dataclass
class StepRecord:
    comm: CommLog
    events: EventLog
    memory: MemoryAccount


@contextmanager
def record_step(
    model: nn.Module, optim: torch.optim.Optimizer | None = None, *, crosscheck: bool = True, peaks: bool = False
) -> Iterator[StepRecord]:
    """All three probes around one block: ``with record_step(model, optim) as step: ...`` (``peaks=True`` adds
    the memory trackers' peaks; see `account_memory`)."""
    with (
        record_comm(crosscheck=crosscheck) as comm,
        record_events(model) as events,
        account_memory(model, optim, peaks=peaks) as memory,
    ):
        yield StepRecord(comm, events, memory)
