"""The pipeline model: GPipe's and 1F1B's per-stage orders (held to what torch's schedules run and to their own
``pipeline_order``), the slot simulation and its bubble, the microbatches held, and the traffic per action."""

from __future__ import annotations

from fractions import Fraction
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checks.models import pipeline as pl

F, B = pl.Action("F", 0), pl.Action("B", 0)


def written(order: list[pl.Action | None]) -> str:
    return " ".join(str(a) if a is not None else "." for a in order)


def test_gpipe_runs_every_forward_then_every_backward() -> None:
    assert written(pl.gpipe(1, 2, 4)) == "F0 F1 F2 F3 B0 B1 B2 B3"


@pytest.mark.parametrize(
    ("stage", "stages", "microbatches", "order"),
    [
        (0, 2, 4, "F0 F1 B0 F2 B1 F3 B2 B3"),  # p − s = 2 forwards first
        (1, 2, 4, "F0 B0 F1 B1 F2 B2 F3 B3"),  # the last stage alternates from its first microbatch
        (0, 4, 4, "F0 F1 F2 F3 B0 B1 B2 B3"),  # p ≥ m: the first stage holds every microbatch, as GPipe
        (2, 4, 4, "F0 F1 B0 F2 B1 F3 B2 B3"),
        (0, 4, 2, "F0 F1 B0 B1"),  # fewer microbatches than stages: min(m, p − s)
    ],
)
def test_one_f_one_b_orders(stage: int, stages: int, microbatches: int, order: str) -> None:
    assert written(pl.one_f_one_b(stage, stages, microbatches)) == order


def _torch_ir(schedule: str, stages: int, microbatches: int) -> dict[int, str]:
    """torch's own ``_get_pipeline_order`` for a single-stage schedule, without a process group (it reads only
    the stage count and the microbatch count), in the model's notation, REDUCE_GRAD left out."""
    from torch.distributed.pipelining.schedules import Schedule1F1B, ScheduleGPipe

    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    ir = kind._get_pipeline_order(SimpleNamespace(_num_stages=stages, _n_microbatches=microbatches))
    return {
        rank: " ".join(str(a).removeprefix(str(rank)) for a in actions if "REDUCE_GRAD" not in str(a))
        for rank, actions in ir.items()
    }


@pytest.mark.parametrize(("stages", "microbatches"), [(2, 4), (4, 4), (3, 6), (4, 8)])
def test_gpipe_is_torchs_pipeline_order(stages: int, microbatches: int) -> None:
    ir = _torch_ir("gpipe", stages, microbatches)
    assert ir == {s: written(o) for s, o in pl.orders("gpipe", stages, microbatches).items()}


@pytest.mark.parametrize(("stages", "microbatches"), [(2, 4), (4, 4), (3, 6), (4, 8)])
def test_one_f_one_b_is_torchs_pipeline_order_but_on_the_last_stage(stages: int, microbatches: int) -> None:
    """torch's 1F1B IR agrees with the model on every stage but the last, where it numbers the forwards from 1:
    with no warm-up forward, ``forward_mb`` starts at 0 and is incremented before its first use. What
    `Schedule1F1B._step_microbatches` runs (guide 21's `pp-schedule` claims record it) is the model's order."""
    ir = _torch_ir("1f1b", stages, microbatches)
    model = pl.orders("1f1b", stages, microbatches)
    last = stages - 1
    assert {s: ir[s] for s in range(last)} == {s: written(model[s]) for s in range(last)}
    shifted = [pl.Action(a.kind, a.microbatch + 1) if a.kind == "F" else a for a in model[last]]
    assert ir[last] == written(shifted)


def test_simulated_slots_of_gpipe_on_two_stages() -> None:
    slots = pl.simulate(pl.orders("gpipe", 2, 4))
    assert written(slots[0]) == "F0 F1 F2 F3 . . B0 B1 B2 B3"
    assert written(slots[1]) == ". F0 F1 F2 F3 B0 B1 B2 B3 ."


def test_simulated_slots_of_1f1b_on_two_stages() -> None:
    slots = pl.simulate(pl.orders("1f1b", 2, 4))
    assert written(slots[0]) == "F0 F1 . B0 F2 B1 F3 B2 . B3"
    assert written(slots[1]) == ". F0 B0 F1 B1 F2 B2 F3 B3 ."


@given(st.integers(1, 6), st.integers(1, 10), st.sampled_from(pl.SCHEDULES))
def test_every_stage_idles_2_p_minus_1_slots(stages: int, microbatches: int, schedule: str) -> None:
    slots = pl.simulate(pl.orders(schedule, stages, microbatches))
    assert {len(row) for row in slots.values()} == {pl.step_slots(stages, microbatches)}
    assert [pl.idle_slots(row) for row in slots.values()] == [2 * (stages - 1)] * stages
    assert pl.bubble(slots) == pl.bubble_formula(stages, microbatches)


def test_bubble_formula() -> None:
    assert pl.bubble_formula(2, 4) == Fraction(1, 5)
    assert pl.bubble_formula(4, 4) == Fraction(3, 7)
    assert pl.bubble_formula(1, 4) == 0


@given(st.integers(1, 6), st.integers(1, 10))
def test_microbatches_held(stages: int, microbatches: int) -> None:
    assert [pl.in_flight(o) for o in pl.orders("gpipe", stages, microbatches).values()] == [microbatches] * stages
    held = [pl.in_flight(o) for o in pl.orders("1f1b", stages, microbatches).values()]
    assert held == [min(microbatches, stages - s) for s in range(stages)]


def test_an_order_that_waits_on_itself_is_a_deadlock() -> None:
    # Stage 0 wants B0 before F1; stage 1 wants F1 (from stage 0) before B0.
    orders = {0: [pl.Action("F", 0), pl.Action("B", 0), pl.Action("F", 1), pl.Action("B", 1)],
              1: pl.gpipe(1, 2, 2)}  # fmt: skip
    with pytest.raises(ValueError, match="deadlock"):
        pl.simulate(orders)


def test_a_backward_before_its_forward_is_refused() -> None:
    with pytest.raises(ValueError, match="runs B0 before F0"):
        pl.simulate({0: [B, F]})


def test_unknown_schedule_and_bad_sizes() -> None:
    with pytest.raises(ValueError, match="unknown schedule"):
        pl.orders("zero-bubble", 2, 4)
    with pytest.raises(ValueError, match="outside a pipeline"):
        pl.gpipe(2, 2, 4)
    with pytest.raises(ValueError, match="at least one stage"):
        pl.bubble_formula(0, 4)


def test_transfers_of_each_position() -> None:
    first = [(t.direction, t.what, t.peer) for t in pl.step_transfers([F, B], 0, 3, 32)]
    middle = [(t.direction, t.what, t.peer) for t in pl.step_transfers([F, B], 1, 3, 32)]
    last = [(t.direction, t.what, t.peer) for t in pl.step_transfers([F, B], 2, 3, 32)]
    assert first == [("send", "activation", 1), ("recv", "gradient", 1)]
    assert middle == [("recv", "activation", 0), ("send", "activation", 2), ("recv", "gradient", 2),
                      ("send", "gradient", 0)]  # fmt: skip
    assert last == [("recv", "activation", 1), ("send", "gradient", 1)]
    assert pl.step_transfers([], 0, 1, 32) == []  # one stage: nothing to send


@given(st.integers(2, 6), st.integers(1, 10), st.data())
def test_traffic_per_step_does_not_depend_on_the_schedule(stages: int, microbatches: int, data: st.DataObject) -> None:
    stage = data.draw(st.integers(0, stages - 1))
    counts = {schedule: sorted((t.direction, t.what) for t in pl.step_transfers(o[stage], stage, stages, 1))
              for schedule, o in ((s, pl.orders(s, stages, microbatches)) for s in pl.SCHEDULES)}  # fmt: skip
    assert counts["gpipe"] == counts["1f1b"]
    assert sum(pl.transfer_counts(stage, stages, microbatches).values()) == microbatches * (
        2 if stage in (0, stages - 1) else 4
    )
    sends = (stage < stages - 1) + (stage > 0)
    assert pl.sent_bytes(stage, stages, microbatches, 128) == 128 * microbatches * sends
