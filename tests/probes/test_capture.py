"""Capture (`checks.ranks.capture`): a ``CheckRequest(capture=True)`` brings back every probe log its check
recorded, each record naming the torch line that issued it, checked against the installed torch's own text; and
without capture nothing of that happens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from checks.probes.comm import CommLog
from checks.probes.event_log import EventLog
from checks.ranks.manager import PoolManager
from checks.ranks.protocol import CheckRequest, CheckRun

TORCH_PARENT = Path(torch.__file__).resolve().parent.parent
STEP = "tests.probes.on_ranks:step_probes"
TWO_STEPS = {"kind": "fsdp1", "steps": 2, "forward_prefetch": True, "backward_prefetch": None}


def line_text(location: str) -> str:
    """The text of ``torch/...py:N`` in the installed torch."""
    path, _, line = location.rpartition(":")
    assert path.startswith("torch/"), location
    return (TORCH_PARENT / path).read_text(encoding="utf-8").splitlines()[int(line) - 1]


def run(pool: PoolManager, request: CheckRequest) -> CheckRun:
    outcome = pool.run(request)
    if outcome.skipped:
        pytest.skip(outcome.skipped)
    assert outcome.ok, outcome.failure
    return outcome


@pytest.fixture(scope="module")
def captured(pool: PoolManager) -> CheckRun:
    return run(pool, CheckRequest(STEP, kwargs=TWO_STEPS, capture=True))


def test_every_probe_block_comes_back_once(captured: CheckRun) -> None:
    for result in captured.results:
        kinds = sorted(type(log).__name__ for log in result.captured)
        assert kinds == ["CommLog", "EventLog"]  # record_step: one of each, whatever the check returned
        events = next(log for log in result.captured if isinstance(log, EventLog))
        assert events.keys() == result.value.events.keys()


def test_a_prefetch_names_its_prefetch_handle_call_and_the_unshard_inside_it(captured: CheckRun) -> None:
    for result in captured.results:
        events = next(log for log in result.captured if isinstance(log, EventLog))
        prefetches = events.select("prefetch")
        assert prefetches, "forward_prefetch issued no prefetch in iteration 2"
        for event in prefetches:
            assert event.source.rpartition(":")[0] == "torch/distributed/fsdp/_runtime_utils.py"
            assert "_prefetch_handle(" in line_text(event.source)
            assert "_unshard(" in line_text(event.via)


def test_every_record_names_a_real_torch_line(captured: CheckRun) -> None:
    result = captured.results[0]
    events = next(log for log in result.captured if isinstance(log, EventLog))
    comm = next(log for log in result.captured if isinstance(log, CommLog))
    called = {"unshard": "_unshard(", "free": "_reshard(", "reshard": "_reshard(", "reduce_grad": "_reduce_grad("}
    for event in events:
        text = line_text(event.source)
        if event.kind in called:  # FSDP calling FSDP: the call in progress
            assert called[event.kind] in text, (event.describe(), text)
        elif event.kind in ("pre_backward", "post_backward", "final_callback"):  # autograd called: the def line
            assert text.startswith("def _"), (event.describe(), text)
    for record in comm:
        module = record.caller.partition(":")[0]
        assert record.source.startswith(module.replace(".", "/") + ".py:"), (record.caller, record.source)
        assert f"{record.api}(" in line_text(record.source), record.describe()


def test_capture_is_off_by_default(pool: PoolManager) -> None:
    outcome = run(pool, CheckRequest(STEP, kwargs=TWO_STEPS))
    assert CheckRequest(STEP).capture is False
    for result in outcome.results:
        assert result.captured == []
        assert all(e.source == "" and e.via == "" for e in result.value.events)
        assert all(r.source == "" for r in result.value.comm)
