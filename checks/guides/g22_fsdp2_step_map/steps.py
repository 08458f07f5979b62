"""Guide 22's workload: mini_gpt with ``fully_shard`` on each block and then on the model, FSDP2's defaults, run
for a few steps with the call recorder (and, on the step a view draws, the event and collective recorders).

The model's input (`checks.models.fsdp2_step_map.step_rows`) is the structure: the blocks in module order, the
root's two outputs (mini_gpt returns its logits and its loss, both needing a gradient) and which side of torch
2.15 this is (`ends_through_iteration`). None of it is read off the recording.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import torch
from torch import nn

from checks.guides.g22_fsdp2_step_map import calls
from checks.models.fsdp2_step_map import step_rows
from checks.probes.call_tree import Call, record_call_tree
from checks.probes.comm import record_comm
from checks.probes.events import record_events
from checks.ranks.context import RankContext
from checks.workloads.gpt import batch, fsdp2_gpt

BLOCKS = ("blocks.0", "blocks.1", "blocks.2")
ROOT_OUTPUTS = 2  # mini_gpt's forward returns (logits, loss)


def ends_through_iteration() -> bool:
    """Torch 2.15 and later end the last backward through ``_end_backward_iteration`` (guide 17)."""
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 15)


def expected_rows(*, first: bool = False, **kept: bool) -> list[str]:
    """The model's rows for the example; ``kept``: ``keep_after_forward`` / ``keep_after_backward``."""
    return step_rows(BLOCKS, first=first, root_outputs=ROOT_OUTPUTS, ends_through_iteration=ends_through_iteration(),
                     **kept)  # fmt: skip


def recorded_steps(
    ctx: RankContext, steps: int = 2, *, drawn: int | None = None, model: nn.Module | None = None
) -> list[list[Call]]:
    """The call trees of ``steps`` forward and backward passes, from a freshly built model (or ``model``); step
    ``drawn`` (1-based) is also recorded by the event and collective recorders, for ``fsdp-readings timeline``."""
    model = model if model is not None else fsdp2_gpt(ctx, None)
    trees = []
    for step in range(1, steps + 1):
        x, y = batch(ctx, step=step)
        with ExitStack() as stack:
            if step == drawn:
                stack.enter_context(record_comm())
                stack.enter_context(record_events(model, label=f"step {step}"))
            roots = stack.enter_context(record_call_tree(calls.SYMBOLS, calls.looker(model), optional=calls.OPTIONAL))
            _, loss = model(x, y)
            loss.backward()
        trees.append(roots)
        _zero_grads(model)
    return trees


def _zero_grads(model: nn.Module) -> None:
    for param in model.parameters():
        param.grad = None


def counts(rows: list[str]) -> dict[str, Any]:
    """What a predict question observes: all-gathers and reduce-scatters in the step's rows."""
    return {
        "all_gathers": sum(r.count("(all-gather)") for r in rows),
        "reduce_scatters": sum(r.count("(reduce-scatter)") for r in rows),
        "hooks": len(rows),
    }
