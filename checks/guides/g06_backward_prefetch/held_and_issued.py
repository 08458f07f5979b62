"""What each mode holds and what it issues in one backward: the units holding unsharded parameters at each
gradient computation's start and after each post-backward hook, the peak bytes, and the order of the
all-gathers and reduce-scatters. Counts are whole units of the flat-parameter model's padded sizes."""

from __future__ import annotations

from typing import Any

from checks.expected import Expected
from checks.guides.g06_backward_prefetch.backward_runs import MODES, build, label, loss_of
from checks.models.unit_counts import unit_counts
from checks.probes.comm import record_comm
from checks.probes.compute_marks import ComputeMarks
from checks.probes.memory_series import record_memory_series
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.gpt import batch, padded_sizes, units


def units_alive(ctx: RankContext, alive: Expected, peaks: Expected) -> dict[str, Any]:
    """Unsharded units alive at each unit's backward compute start and after each post-backward hook, by mode: the
    bytes of the ``unsharded`` category over the layout model's padded unit sizes must be whole units, as many as
    the guide's table says (a column per mode); the peak bytes are the guide's."""
    # The table's columns after `moment` are the modes, in `MODES`'s order.
    require_equal(list(alive.header[1:]), [label(m) for m in MODES], reason="table-header", what="the table's modes")
    sizes = {unit: 4 * numel for unit, numel in padded_sizes(ctx.world_size, element_bytes=4).items()}
    observed: dict[str, Any] = {}
    series: dict[str, Any] = {}
    for mode in MODES:
        name = label(mode)
        model = build(ctx, "gpt", mode)
        marks = ComputeMarks(units(model))
        x, y = batch(ctx)
        with record_memory_series(model) as recorder:
            marks.on_mark = lambda unit, recorder=recorder: recorder.mark(f"compute {unit}")
            _, loss = model(x, y)
            loss.backward()
        points = [(m.replace("backward ", "post-backward ", 1), b["unsharded"])
                  for m, b in recorder.series.points if not m.startswith("forward ")]  # fmt: skip
        counts = {}
        for moment, nbytes in points:
            found = unit_counts(nbytes, sizes)
            message = f"{name} at {moment}: {nbytes} unsharded bytes are not a whole number of units {sizes}"
            require(len(found) == 1, "not-whole-units", message, moment=moment, nbytes=nbytes, mode=name)
            counts[moment] = found.pop()
        alive.require_rows(list(counts), reason="moments-differ", what=f"{name}: moments measured",
                           text=lambda row: row.key)  # fmt: skip
        alive.require_values(counts, reason="units-alive", what=f"{name}: units alive", mode=name,
                             value=lambda row, name=name: int(alive.cells(row)[name]))  # fmt: skip
        peak, row = max(nbytes for _, nbytes in points), peaks.row(name)
        stated_peak = int(peaks.cells(row)["peak bytes"])
        message = f"{name}: peak unsharded bytes: {peak}, expected {stated_peak}"
        peaks.require(peak == stated_peak, row, "peak-bytes", message, observed=peak, expected=stated_peak, mode=name)
        observed[name] = {**counts, "peak bytes": peak}
        series[name] = recorder.series.points  # `fsdp-readings memory 06-backward-prefetch units-alive`
    return {**observed, "series": series}


def collective_order(ctx: RankContext, expected: Expected) -> dict[str, str]:
    """The order in which one backward issues its all-gathers (AG) and reduce-scatters (RS), by mode, is the
    guide's."""
    short = {"all_gather": "AG", "reduce_scatter": "RS"}
    observed = {}
    for mode in MODES:
        name = label(mode)
        model = build(ctx, "gpt", mode)
        loss = loss_of(ctx, "gpt", model)
        with record_comm() as comm:
            loss.backward()
        got = " ".join(short[c.op] for c in comm if c.op in short)
        row = expected.row(name)
        want = expected.cells(row)["issue order"]
        message = f"{name}: collectives in issue order: {got!r}, expected {want!r}"
        expected.require(got == want, row, "collective-order", message, observed=got, expected=want, mode=name)
        observed[name] = got
    return observed
