"""Renderings: expected vs observed with the first divergence marked, per-rank sequences, comm and memory tables,
as plain text (failure messages) — in this process, from hand-made records."""

from __future__ import annotations

import pytest

from checks.probes.comm import Collective, CommLog
from checks.probes.event_log import EventLog, FsdpEvent
from checks.probes.expect import SequenceMismatch, assert_sequence
from checks.probes.memory import MemorySnapshot, StorageEntry
from checks.probes.render import (
    MARK,
    comm_records,
    comm_table,
    event_table,
    first_divergence,
    memory_table,
    rank_sequences,
    side_by_side,
    to_text,
)


def rows_with_mark(text: str) -> list[str]:
    return [line for line in text.splitlines() if MARK in line]


def test_side_by_side_marks_only_the_first_divergence() -> None:
    text = to_text(side_by_side(["a", "b", "c"], ["a", "x", "y", "d"], title="order"))
    marked = rows_with_mark(text)
    assert len(marked) == 1 and "b" in marked[0] and "x" in marked[0] and marked[0].split()[1] == "2"
    assert "first divergence at #2" in text and "\x1b[" not in text
    assert "—" in text  # the expected side ran out
    assert "identical" in to_text(side_by_side(["a"], ["a"])) and not rows_with_mark(to_text(side_by_side([], [])))


@pytest.mark.parametrize(
    ("expected", "observed", "at"),
    [(["a", "b"], ["a", "b"], None), (["a", "b"], ["a"], 1), (["a"], ["a", "b"], 1), (["a"], ["b"], 0)],
)
def test_first_divergence(expected: list[str], observed: list[str], at: int | None) -> None:
    assert first_divergence(expected, observed) == at


def test_assert_sequence_fails_with_the_rendering() -> None:
    assert_sequence(["x"], ["x"])
    with pytest.raises(SequenceMismatch) as failure:
        assert_sequence(["pre_backward 1", "post_backward 1"], ["pre_backward 1", "prefetch 1→0"], what="backward")
    message = str(failure.value)
    assert message.startswith("backward differs from the expectation:")
    assert "prefetch 1→0" in rows_with_mark(message)[0] and "post_backward 1" in rows_with_mark(message)[0]


def _record(index: int, op: str, numel: int, ring: float, objects: bool = False) -> Collective:
    return Collective(index, op, "c10d::op", "all_gather_object" if objects else "api", "mod:fn", "torch.float32",
                      numel, 4 * numel, ring, 2, (0, 1), "gloo", (numel,), object_collective=objects)  # fmt: skip


def test_comm_table_counts_bytes_totals_and_ratios() -> None:
    records = [_record(1, "all_gather", 8, 16.0), _record(2, "all_gather", 8, 16.0)]
    records += [_record(3, "reduce_scatter", 8, 16.0), _record(4, "all_gather", 3, 6.0, objects=True)]
    log = CommLog(0, 2, records)
    lines = to_text(comm_table(log, reference_bytes=64)).splitlines()
    row = {line.split()[0]: line.split() for line in lines if line.split() and line.split()[0] in
           ("all_gather", "reduce_scatter", "total")}  # fmt: skip
    assert row["all_gather"] == ["all_gather", "2", "16", "64", "32", "67%", "0.500"]
    assert row["reduce_scatter"] == ["reduce_scatter", "1", "8", "32", "16", "33%", "0.250"]
    assert row["total"] == ["total", "3", "24", "96", "48", "100%", "0.750"]  # the object collective is left out
    everything = to_text(comm_table(log, objects=None))
    assert any(line.split()[:2] == ["all_gather", "3"] for line in everything.splitlines())
    assert "all_gather_object (object)" in to_text(comm_records(log))


def _events(rank: int, kinds: list[tuple[str, str, str | None]]) -> EventLog:
    events = [FsdpEvent(i, 1, kind, unit, "BACKWARD_PRE", target, rank=rank) for i, (kind, unit, target) in
              enumerate(kinds, start=1)]  # fmt: skip
    return EventLog(rank, 2, events)


def test_event_tables_and_rank_divergence() -> None:
    common = [("pre_backward", "root", None), ("prefetch", "root", "1")]
    logs = [_events(0, [*common, ("post_backward", "1", None)]), _events(1, [*common, ("post_backward", "0", None)])]
    text = to_text(event_table(logs[0]))
    assert "prefetch" in text and "root" in text and "BACKWARD_PRE" in text
    marked = rows_with_mark(to_text(rank_sequences(logs)))
    assert len(marked) == 1 and "post_backward 1" in marked[0] and "post_backward 0" in marked[0]
    assert logs[0].sequence() == ["pre_backward root", "prefetch root→1", "post_backward 1"]


def test_memory_table_fractions() -> None:
    ddp = MemorySnapshot(0, [StorageEntry("params", "w", 392, "torch.float32")])
    fsdp = MemorySnapshot(0, [StorageEntry("params", "w", 196, "torch.float32")])
    params = next(line for line in to_text(memory_table({"ddp": ddp, "fsdp": fsdp})).splitlines()
                  if line.startswith("params") or " params " in f" {line} ")  # fmt: skip
    assert params.split()[:4] == ["params", "392", "196", "1/2"]
