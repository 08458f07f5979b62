"""The pipeline-stage recorder: every ``forward_one_chunk`` and ``backward_one_chunk`` in call order, with the
microbatches the stage held, against 1F1B's and GPipe's orders written out here by hand."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("schedule", "orders", "held"),
    [
        ("1f1b", [["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"], ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]],
         [2, 1]),
        ("gpipe", [["F0", "F1", "F2", "F3", "B0", "B1", "B2", "B3"]] * 2, [4, 4]),
    ],
)  # fmt: skip
def test_a_stage_records_its_order_and_what_it_held(ranks, schedule: str, orders: list[list[str]],
                                                    held: list[int]) -> None:  # fmt: skip
    recorded = ranks("pipeline_stage_actions", 2, schedule=schedule)
    assert [r["actions"] for r in recorded] == orders
    assert [r["held"] for r in recorded] == held
    assert [r["stages"] for r in recorded] == [{"0"}, {"1"}]
