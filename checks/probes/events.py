"""Record what FSDP does, in order, on this rank: ``with record_events(model) as events: ...``.

Events (kind: meaning):

- ``root_pre_forward``: the root's pre-forward logic ran (start of a forward pass).
- ``unshard``: FSDP issued an unshard of a unit for its own use (FSDP1 ``_unshard``; FSDP2
  ``FSDPParamGroup.unshard`` that started an all-gather). ``detail`` says whether FSDP1's unshard all-gathers
  (``"all-gather"``) or finds the parameter already unsharded / unsharded by strategy (``"no all-gather"``).
- ``prefetch``: an unshard issued ahead of time: ``unit`` is the unit whose hook issued it, ``target`` the unit
  it unshards, ``state`` the issuer's training state (BACKWARD_PRE / BACKWARD_POST / FORWARD ...).
- ``wait_unshard`` (FSDP2): a unit waits for its issued all-gather and copies it out (with a prefetch, this is
  where the overlap ends).
- ``free``: a reshard that frees the unsharded parameter; ``reshard``: one that keeps it (FSDP1
  ``_reshard(free_unsharded_flat_param=False)``, or FSDP2's reshard to the post-forward mesh).
- ``pre_backward`` / ``post_backward``: the unit's backward hooks (once per unit per backward; FSDP1 runs the
  pre-backward hook once per output tensor and only the first run does anything, so only that one is recorded).
- ``reduce_grad``: the unit's gradient reduction was issued; ``detail`` names the collective(s).
- ``final_callback``: the root's post-backward final callback; the iteration ends when it returns.

Each event has the unit's name (`checks.naming`: ``root``, ``blocks.0``; wrapper attributes removed), the unit's
training state when the event began (FSDP1 ``HandleTrainingState``, FSDP2 ``TrainingState`` names), the iteration
(1 until the first final callback returns, then 2, ...), the rank, and ``seq`` from the clock shared with the comm
recorder.
`FsdpEvent.key` leaves out the rank and ``seq`` so that logs compare across ranks. When the check is captured
(`checks.ranks.capture`), each event also names the torch line that issued it (``source``, ``via``; the rules are
in `checks.probes.fsdp_hooks`).

How: FSDP1 registers its hooks as ``functools.partial`` objects that hold the functions at wrap time, so patching
module attributes after wrapping would miss them. The recorder swaps the functions' code instead
(`checks.probes.calls`: the function object the partials hold runs a trampoline that calls the hook with its frame,
then the original code), and reads the frame's arguments (state, handle, param group). No trace function is
installed, so the rest of the step runs at full speed. Runtime evidence (`checks.ranks.marks`) may watch the same
functions: the trampoline fires its mark (`checks.ranks.codeswap`). Frames whose outcome matters (did this FSDP2
``unshard`` start an all-gather?) are also observed at return. Backward runs on the calling thread while
recording (``torch.autograd.set_multithreading_enabled(False)``) so that events keep one order on GPU too.

Blind spots: FSDP code outside the observed functions (``summon_full_params``, state-dict hooks) records only
what it does through them; FSDP1 units without parameters (a root with no handle) record no pre-backward event;
unit names need ``model`` unless the recording sees the root's pre-forward (FSDP1) or FSDP2 has lazily initialised (its
param groups know their module path); FSDP1's composable ``fully_shard`` states are not modules, so their names need
``model``. The observed functions are resolved when a recording starts: one a new torch renamed fails loudly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from checks.probes import calls, fsdp_hooks
from checks.probes.event_log import EventLog, FsdpEvent
from checks.probes.recording import Recording
from checks.ranks import capture

__all__ = ["EventLog", "FsdpEvent", "RecorderFailed", "record_events"]


class RecorderFailed(AssertionError):
    """A recorder's own hook failed: its recording cannot be trusted."""


@contextmanager
def record_events(model: nn.Module | None = None, *, label: str = "") -> Iterator[EventLog]:
    """Record FSDP1 and FSDP2 events in the block (see the module docstring). ``model``: the root module, for
    unit names; ``label``: what this recording is, when a check records several ("step 2, blocks reversed"), as
    ``fsdp-readings timeline`` names it. Raises `RecorderFailed` at exit if one of its hooks failed."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    log = EventLog(rank=rank, world_size=dist.get_world_size() if dist.is_initialized() else 1, label=label)
    recording = Recording(model, rank)
    hooks = fsdp_hooks.hook_table(recording)
    with torch.autograd.set_multithreading_enabled(False), calls.subscribed(hooks) as subscription:
        try:
            yield log
        finally:
            log.events = recording.finish()
            log.completed_iterations = recording.iteration - 1
            log.notes = recording.notes
            capture.add(log)
    if subscription.errors:
        error = subscription.errors[0]
        raise RecorderFailed(f"the FSDP event recorder's hook failed, so its events are incomplete: {error!r}") from (
            error
        )
