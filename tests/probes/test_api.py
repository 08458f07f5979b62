"""The three-line API on a real step, and the probes agreeing with each other: every all-gather the comm recorder
saw sits inside an unshard or prefetch the event recorder saw, for the same unit and size."""

from __future__ import annotations

import pytest

from checks.probes.comm import CommLog
from checks.probes.event_log import EventLog
from checks.probes.render import comm_table, rank_sequences, to_text
from tests.probes.probe_spec import ALIGN, FP32, flat_numel, fsdp2_unit_shard, theta


def gathered_by_events(comm: CommLog, events: EventLog) -> list[tuple[str, int]]:
    """For each all-gather record, the unit of the latest unshard/prefetch event issued before it (by the shared
    sequence clock) and the record's size."""
    issuing = [e for e in events if e.kind in ("unshard", "prefetch") and e.detail == "all-gather"]
    out = []
    for record in comm.select("all_gather"):
        event = max((e for e in issuing if e.seq < record.seq), key=lambda e: e.seq)
        out.append((event.target if event.kind == "prefetch" else event.unit, record.numel))
    return out


@pytest.mark.parametrize("kind", ["fsdp1", "fsdp2"])
def test_three_lines_record_a_step_and_the_probes_agree(ranks, kind: str) -> None:
    values = ranks("three_lines", kind=kind)
    comm, events, memory = values[0]["comm"], values[0]["events"], values[0]["memory"]
    assert not events.notes, events.notes  # FQNs resolved without being given the model
    size = (lambda u: flat_numel(u, 2)) if kind == "fsdp1" else (lambda u: 2 * fsdp2_unit_shard(u, 2))
    pairs = gathered_by_events(comm, events)
    assert pairs == [(unit, size(unit)) for unit, _ in pairs]  # each all-gather is its unit's full size
    assert len(pairs) == len([e for e in events if e.detail == "all-gather"])
    assert comm.count("reduce_scatter") == len(events.select("reduce_grad")) == 3
    assert memory.after.nbytes("params") > 0 and memory.peak is not None and memory.peak_unavailable is None
    assert all(v["events"].keys() == events.keys() and v["comm"].keys() == comm.keys() for v in values)
    table = to_text(comm_table(comm, reference_bytes=theta() * FP32))
    ratio = comm.ring_bytes() / (theta() * FP32)
    assert f"{ratio:.3f}" in table.splitlines()[-1]  # the footer's total ratio
    assert "rank 0" in to_text(rank_sequences([v["events"] for v in values]))


def test_probes_beyond_the_toy_mini_gpt(ranks) -> None:
    """mini_gpt's tiny preset under FSDP1 (use_orig_params, a unit per block, BACKWARD_PRE): the root (embeddings,
    final norm, tied head) computes the output, so the prefetch chain runs root → last block → … → first block;
    tied weights are one storage; every collective is witnessed by gloo."""
    values = ranks("mini_gpt_steps", probe="all")
    step, layers = values[0]["step"], values[0]["n_layer"]
    blocks = [f"blocks.{i}" for i in reversed(range(layers))]
    assert step.events.prefetches(iteration=1) == list(zip(["root", *blocks], blocks, strict=False))
    assert step.comm.crosscheck.ok and step.comm.count("reduce_scatter") == 2 * (layers + 1)  # two steps
    assert not step.events.notes
    # Both ranks' parameter bytes: |θ| (tied weights once) plus padding: at most 3 alignment elements before each
    # parameter tensor and N−1 world-size elements per flat parameter.
    total = sum(v["step"].memory.after.nbytes("params") for v in values)
    padding = (ALIGN - 1) * values[0]["tensors"] + (len(values) - 1) * (layers + 1)
    assert FP32 * values[0]["numel"] <= total <= FP32 * (values[0]["numel"] + padding)
