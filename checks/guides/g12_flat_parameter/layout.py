"""Guide 12's layout diagram, drawn from a real ``FlatParameter``: the guide's unit on four ranks
(`checks.workloads.drawn_unit.LAYOUT_UNIT`), its metadata drawn by `checks.models.flat_param_diagram` and compared
row for row with the guide's ``expect layout-at-4`` block, exactly as drawn. `real_layout` is also what
``fsdp-readings layout`` and the inspector's diagrams read (`checks.inspect.measure`)."""

from __future__ import annotations

from typing import Any

from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from checks.expected import Expected
from checks.models.flat_param_diagram import diagram_lines, layout_fields
from checks.ranks.context import RankContext
from checks.violation import require_equal
from checks.workloads.drawn_unit import LAYOUT_UNIT, wrap_unit

ROW_ROOM = 78  # a guide's expect row fits 80 columns with a cell each side


def real_layout(model: FSDP, ctx: RankContext, title: str = "") -> dict[str, Any]:
    """`layout_fields` from the real ``FlatParameter``'s metadata, with each rank's shard size gathered (every rank
    must report the same)."""
    flat = model._handle.flat_param
    sizes = ctx.gather(flat._sharded_size.numel())
    require_equal(sorted(set(sizes)), [sizes[0]], reason="shard-sizes-differ", what="shard sizes across ranks")
    return layout_fields(
        fqns=list(flat._fqns),
        shapes=[list(s) for s in flat._shapes],
        numels_with_padding=list(flat._numels_with_padding),
        is_padding_mask=list(flat._is_padding_mask),
        world_size=ctx.world_size,
        shard_numel=sizes[0],
        sharded=model._handle.uses_sharded_strategy,
        shared=[
            (f"{s.module_name}.{s.param_name}", f"{s.prim_module_name}.{s.prim_param_name}")
            for s in flat._shared_param_infos
        ],
        title=title,
    )


def layout_diagram(ctx: RankContext, expected: Expected, use_orig_params: bool = True) -> dict[str, Any]:
    """The guide's unit wrapped on this world, its diagram drawn from the real metadata and compared line by line
    with the guide's ``expect`` block, spacing included; returns the fields for ``fsdp-readings layout``."""
    unit = {**LAYOUT_UNIT, "use_orig_params": use_orig_params}
    model = wrap_unit(ctx, unit)
    fields = real_layout(model, ctx, title="the unit")
    lines = [line.rstrip() for line in diagram_lines(fields, width=ROW_ROOM)]  # no row starts blank: compared whole
    # A failure carries the fields too, so `fsdp-readings layout` can draw what the ranks built instead.
    for i, (got, row) in enumerate(zip(lines, expected, strict=False)):
        expected.require(got == row.text, row, "diagram-differs", f"diagram line {i + 1}: {got!r}, expected "
                         f"{row.text!r}", observed=got, expected=row.text, line=i + 1, lines=lines,
                         layout=fields)  # fmt: skip
    if len(lines) != len(expected):
        # the first row not drawn, or the last row when the drawing is longer
        row = expected.rows[min(len(lines), len(expected) - 1)]
        expected.fail(row, "diagram-length-differs", f"diagram lines: {len(lines)!r}, expected {len(expected)!r}",
                      observed=len(lines), expected=len(expected), lines=lines, layout=fields)  # fmt: skip
    counts = {kind: sum(s["numel"] for s in fields["segments"] if s["kind"] == kind) for kind in ("align", "tail")}
    rank_params = {
        f"rank{r['rank']}": [
            s["fqn"]
            for s in fields["segments"]
            if s["kind"] == "param" and s["numel"] and s["offset"] < r["end"] and s["offset"] + s["numel"] > r["start"]
        ]
        for r in fields["ranks"]
    }
    return {"layout": fields, "alignment_padding": counts["align"], "tail_padding": counts["tail"], **rank_params}
