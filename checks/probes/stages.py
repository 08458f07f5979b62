"""Record what a pipeline stage computes, in order, on this rank: ``with record_stage_actions() as actions: ...``.

`torch.distributed.pipelining` runs a stage's microbatches through two methods of ``_PipelineStageBase``, whatever
the schedule: ``forward_one_chunk(fwd_chunk_id, ...)`` and ``backward_one_chunk(bwd_chunk_id, ...)``. The recorder
observes both (`checks.probes.calls`: their code swapped for trampolines while the block runs, no trace function)
and writes one event per call into an `EventLog`:

- ``forward`` / ``backward``: ``unit`` is ``microbatch <i>`` (the chunk id the schedule passed), ``target`` the
  stage's index, ``state`` ``FORWARD`` / ``BACKWARD``, stamped at entry on the clock the collective recorder shares
  (`checks.probes.clock`), so a recording of both says which send or receive came before which action;
  ``detail`` is ``"<k> held"``, the entries of the stage's forward cache (``fwd_cache``; ``_forward_chunk_states``
  from torch 2.15) when the call began: the microbatches
  whose forward outputs and inputs it keeps for their backward (`held_at_most`).

The schedule's own view of the order (``pipeline_order``) is an attribute a check can read; this is what ran.
Blind spots: a ``backward_weight_one_chunk`` (zero-bubble schedules' separate weight pass) is not observed, and a
``backward_one_chunk`` that returns early (a stage without backward) is still recorded, as it was called.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist

from checks.probes import calls, clock
from checks.probes.event_log import EventLog, FsdpEvent
from checks.ranks import capture

STAGE_BASE = "torch.distributed.pipelining.stage:_PipelineStageBase"
OBSERVED = {"forward_one_chunk": ("forward", "fwd_chunk_id"), "backward_one_chunk": ("backward", "bwd_chunk_id")}
API = "pipelining"


class StageRecorderFailed(AssertionError):
    """The recorder's own hook failed: its recording cannot be trusted."""


@contextmanager
def record_stage_actions(*, label: str = "") -> Iterator[EventLog]:
    """Every ``forward_one_chunk`` and ``backward_one_chunk`` call in the block, in call order (see the module
    docstring). Raises `StageRecorderFailed` at exit if one of its hooks failed."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    log = EventLog(rank=rank, world_size=dist.get_world_size() if dist.is_initialized() else 1, label=label)

    def hook_for(kind: str, chunk_argument: str) -> calls.CallHook:
        def hook(frame: types.FrameType) -> None:
            stage = frame.f_locals["self"]
            chunk = frame.f_locals[chunk_argument]
            index = len(log.events) + 1
            held = f"{len(_forward_cache(stage))} held"  # microbatches whose forward outputs it keeps, before this call
            log.events.append(FsdpEvent(index, 1, kind, f"microbatch {chunk}", kind.upper(), str(stage.stage_index),
                                        held, api=API, rank=rank, seq=clock.tick()))  # fmt: skip

        return hook

    hooks = {calls.function_code(f"{STAGE_BASE}.{name}"): hook_for(*what) for name, what in OBSERVED.items()}
    with calls.subscribed(hooks) as subscription:
        try:
            yield log
        finally:
            log.completed_iterations = 1
            capture.add(log)
    if subscription.errors:
        raise StageRecorderFailed(f"the stage recorder's hook failed: {subscription.errors[0]!r}")


def _forward_cache(stage: object) -> dict[int, object]:
    """The stage's per-microbatch forward state: ``fwd_cache`` up to torch 2.14, ``_forward_chunk_states`` from
    2.15 (each maps a chunk id to what its backward needs)."""
    cache = getattr(stage, "_forward_chunk_states", None)
    return cache if cache is not None else stage.fwd_cache  # type: ignore[attr-defined]


def actions(log: EventLog) -> list[str]:
    """The recorded order as the pipeline model writes it: ``["F0", "F1", "B0", ...]``."""
    return [f"{'F' if e.kind == 'forward' else 'B'}{e.unit.removeprefix('microbatch ')}" for e in log.events]


def held_at_most(log: EventLog) -> int:
    """The most microbatches the stage kept at once: its ``fwd_cache`` as each backward began (every forward adds
    one entry, every backward pops its own, so the largest count is always met at a backward's entry)."""
    return max((int(e.detail.split()[0]) for e in log.events if e.kind == "backward"), default=0)
