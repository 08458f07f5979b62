"""All three probes around one block: ``with record_step(model, optim) as step:`` (``step.comm``, ``step.events``,
``step.memory``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from checks.probes.comm import CommLog, record_comm
from checks.probes.event_log import EventLog
from checks.probes.events import record_events
from checks.probes.memory import MemoryAccount, account_memory


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
