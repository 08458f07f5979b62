"""Pipeline parallelism as slots: the order each stage runs its microbatches, the point-to-point traffic that
order needs, and the bubble it leaves (torch-free; guide 21).

A pipeline of p stages (one per rank) runs m microbatches per step. Each stage runs a forward ``F i`` and a
backward ``B i`` for every microbatch i. What each stage runs, in order:

- GPipe (``ScheduleGPipe``): every forward, then every backward: F0 … F(m−1), B0 … B(m−1).
- 1F1B (``Schedule1F1B``): stage s first runs ``min(m, p − s)`` forwards, then alternates one backward and one
  forward while forwards remain, then the remaining backwards. The last stage alternates from its first
  microbatch on (F0 B0 F1 B1 …); the first stage holds p microbatches before its first backward.

Which action waits on which (the data a stage cannot compute without):

- ``F i`` on stage s needs ``F i`` of stage s − 1: its output is this stage's input (an activation, sent);
- ``B i`` on stage s needs ``B i`` of stage s + 1: the gradient of this stage's output (sent back), and, on the
  last stage, its own ``F i``, whose output the loss is computed from.

`simulate` runs every stage's order with each action one slot long and each action as early as its stage and its
dependency allow: a slot in which a stage runs nothing is idle. Over a step of 2(m + p − 1) slots every stage
is busy for 2m, so each is idle for 2(p − 1) slots: the bubble, a fraction (p − 1)/(m + p − 1) of the step, the
same for GPipe and 1F1B when F and B take one slot each. The schedules differ in memory: a stage keeps a
microbatch's activations from its forward to its backward, so GPipe holds m at once and 1F1B at most p − s
(`in_flight`).

The traffic (`transfers`): each forward of a stage that is not the last sends its output activation to s + 1;
each forward of a stage that is not the first receives its input from s − 1; each backward of a stage that is not
the first sends the gradient of its input to s − 1; each backward of a stage that is not the last receives the
gradient of its output from s + 1. Per step and stage: m of each that applies, of one microbatch's activation.

Inputs are plain (stage count, microbatch count, elements of one activation), so a planner can ask for a
strategy's bubble and bytes before anything runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

FORWARD, BACKWARD = "F", "B"
SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True, order=True)
class Action:
    """One stage's forward or backward of one microbatch: ``Action("F", 2)`` is written ``F2``."""

    kind: str  # "F" | "B"
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}"


@dataclass(frozen=True)
class Transfer:
    """One point-to-point message a stage sends or receives for one action."""

    direction: str  # "send" | "recv"
    what: str  # "activation" | "gradient"
    peer: int  # the other stage
    microbatch: int
    numel: int


def _check(stages: int, microbatches: int, stage: int | None = None) -> None:
    if stages < 1 or microbatches < 1:
        raise ValueError(f"a pipeline needs at least one stage and one microbatch, not {stages} and {microbatches}")
    if stage is not None and not 0 <= stage < stages:
        raise ValueError(f"stage {stage} is outside a pipeline of {stages}")


def gpipe(stage: int, stages: int, microbatches: int) -> list[Action]:
    """GPipe's order on ``stage``: every forward, then every backward, in microbatch order."""
    _check(stages, microbatches, stage)
    return [Action(FORWARD, i) for i in range(microbatches)] + [Action(BACKWARD, i) for i in range(microbatches)]


def one_f_one_b(stage: int, stages: int, microbatches: int) -> list[Action]:
    """1F1B's order on ``stage``: ``min(m, p − s)`` forwards, then one backward and one forward while forwards
    remain, then the remaining backwards."""
    _check(stages, microbatches, stage)
    warmup = min(microbatches, stages - stage)
    order = [Action(FORWARD, i) for i in range(warmup)]
    forwards, backwards = warmup, 0
    while backwards < microbatches:
        order.append(Action(BACKWARD, backwards))
        backwards += 1
        if forwards < microbatches:
            order.append(Action(FORWARD, forwards))
            forwards += 1
    return order


def orders(schedule: str, stages: int, microbatches: int) -> dict[int, list[Action]]:
    """Every stage's order under ``schedule`` (``gpipe`` or ``1f1b``)."""
    build = {"gpipe": gpipe, "1f1b": one_f_one_b}.get(schedule)
    if build is None:
        raise ValueError(f"unknown schedule {schedule!r}; one of {', '.join(SCHEDULES)}")
    return {s: build(s, stages, microbatches) for s in range(stages)}


def _depends_on(action: Action, stage: int, stages: int) -> tuple[int, Action] | None:
    """The (stage, action) whose data ``action`` on ``stage`` needs from another stage, if any."""
    if action.kind == FORWARD:
        return (stage - 1, action) if stage > 0 else None
    return (stage + 1, action) if stage < stages - 1 else None


def simulate(per_stage: Mapping[int, Sequence[Action]]) -> dict[int, list[Action | None]]:
    """Each stage's slots when every action takes one slot and starts as soon as its stage is free and its
    dependency (previous stage's forward, next stage's backward) has finished; ``None`` is an idle slot. Every
    stage's row runs to the step's last slot. Raises ValueError on an order that can never finish (a deadlock)
    or that runs a backward before its own forward."""
    stages = len(per_stage)
    end: dict[tuple[int, Action], int] = {}
    position = dict.fromkeys(range(stages), 0)
    free = dict.fromkeys(range(stages), 0)
    remaining = sum(len(o) for o in per_stage.values())
    while remaining:
        progressed = False
        for s in range(stages):
            order = per_stage[s]
            while position[s] < len(order):
                action = order[position[s]]
                if action.kind == BACKWARD and (s, Action(FORWARD, action.microbatch)) not in end:
                    raise ValueError(f"stage {s} runs {action} before F{action.microbatch}")
                dependency = _depends_on(action, s, stages)
                if dependency is not None and dependency not in end:
                    break
                start = max(free[s], end[dependency] if dependency is not None else 0)
                end[(s, action)] = free[s] = start + 1
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {s: str(per_stage[s][position[s]]) for s in range(stages) if position[s] < len(per_stage[s])}
            raise ValueError(f"the orders deadlock: stages wait on each other at {stuck}")
    total = max(free.values(), default=0)
    slots: dict[int, list[Action | None]] = {s: [None] * total for s in range(stages)}
    for (s, action), finish in end.items():
        slots[s][finish - 1] = action
    return slots


def idle_slots(slots: Sequence[Action | None]) -> int:
    return sum(1 for slot in slots if slot is None)


def bubble(per_stage_slots: Mapping[int, Sequence[Action | None]]) -> Fraction:
    """Idle slots over all slots, every stage together."""
    total = sum(len(row) for row in per_stage_slots.values())
    return Fraction(sum(idle_slots(row) for row in per_stage_slots.values()), total) if total else Fraction(0)


def bubble_formula(stages: int, microbatches: int) -> Fraction:
    """The textbook bubble fraction (p − 1)/(m + p − 1)."""
    _check(stages, microbatches)
    return Fraction(stages - 1, microbatches + stages - 1)


def step_slots(stages: int, microbatches: int) -> int:
    """Slots of a step when F and B take one each: 2(m + p − 1)."""
    _check(stages, microbatches)
    return 2 * (microbatches + stages - 1)


def in_flight(order: Sequence[Action]) -> int:
    """The most microbatches a stage holds at once: forwarded, not yet backwarded (their activations are kept)."""
    held = peak = 0
    for action in order:
        held += 1 if action.kind == FORWARD else -1
        peak = max(peak, held)
    return peak


def transfers(action: Action, stage: int, stages: int, activation_numel: int) -> list[Transfer]:
    """What one action of ``stage`` receives before it runs and sends after, in that order."""
    first, last = stage == 0, stage == stages - 1
    i, n = action.microbatch, activation_numel
    if action.kind == FORWARD:
        before = [] if first else [Transfer("recv", "activation", stage - 1, i, n)]
        after = [] if last else [Transfer("send", "activation", stage + 1, i, n)]
    else:
        before = [] if last else [Transfer("recv", "gradient", stage + 1, i, n)]
        after = [] if first else [Transfer("send", "gradient", stage - 1, i, n)]
    return before + after


def step_transfers(order: Sequence[Action], stage: int, stages: int, activation_numel: int) -> list[Transfer]:
    """Every transfer of one step of ``stage``, action by action."""
    return [t for action in order for t in transfers(action, stage, stages, activation_numel)]


def transfer_counts(stage: int, stages: int, microbatches: int) -> dict[tuple[str, str], int]:
    """{(direction, what): count} per step: m of each that applies to the stage's position."""
    _check(stages, microbatches, stage)
    out: dict[tuple[str, str], int] = {}
    for t in step_transfers(gpipe(stage, stages, microbatches), stage, stages, 1):
        out[(t.direction, t.what)] = out.get((t.direction, t.what), 0) + 1
    return out


def sent_bytes(stage: int, stages: int, microbatches: int, activation_bytes: int) -> int:
    """Bytes ``stage`` sends per step: one activation per forward (not the last stage) and one gradient per
    backward (not the first), whatever the schedule."""
    counts = transfer_counts(stage, stages, microbatches)
    return activation_bytes * (counts.get(("send", "activation"), 0) + counts.get(("send", "gradient"), 0))
