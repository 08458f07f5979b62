"""nine-rows-on-four: the guide's fixed model on four ranks, row for row its `expect nine-rows-on-four` block
(each rank's local shapes, elements and bytes; each parameter's all-gather output), and the same rows written by
the spec alone."""

from __future__ import annotations

from typing import Any

from torch import nn

from checks.expected import Expected
from checks.guides.g16_fsdp2_per_parameter_sharding.fsdp_params import by_fqn, wrap
from checks.guides.g16_fsdp2_per_parameter_sharding.memory import held_bytes
from checks.models import fsdp2_shards as spec
from checks.ranks.context import RankContext
from checks.violation import require_equal

# The guide's fixed model (its `expect nine-rows-on-four` block): dim 0 of 9 (not divisible by 4), 3 (fewer rows
# than ranks) and 0 (none), and a (9, 0) parameter with rows but no elements; fp32.
NINE: dict[str, Any] = {
    "root": [
        {"name": "w", "shape": [9, 2], "dtype": "float32"},
        {"name": "b", "shape": [3], "dtype": "float32"},
        {"name": "e", "shape": [0, 4], "dtype": "float32"},
        {"name": "z", "shape": [9, 0], "dtype": "float32"},
    ],
    "child": None,
}


def _shape_text(shape: Any) -> str:
    return "x".join(str(d) for d in shape)


def _nine_lines(module: nn.Module, n: int, rank: int) -> dict[str, Any]:
    locals_ = {name: module.get_parameter(name).to_local() for name in ("w", "b", "e", "z")}
    shapes = " ".join(f"{name} {_shape_text(t.shape)}" for name, t in locals_.items())
    elements = sum(t.numel() for t in locals_.values())
    return {"line": f"rank {rank}: {shapes}  holds {elements} elements in {held_bytes(module, NINE)} bytes"}


def _spec_lines(n: int) -> list[str]:
    """The block's rows as the spec writes them, without torch."""
    shapes = [(p["name"], tuple(p["shape"])) for p in NINE["root"]]
    params = [(shape, 4) for _, shape in shapes]
    lines = [
        f"rank {r}: "
        + " ".join(f"{name} {_shape_text(spec.local_shape(shape, n, r))}" for name, shape in shapes)
        + f"  holds {sum(spec.local_numel(s, n, r) for s, _ in params)} elements in {spec.shard_bytes(params, n)} bytes"
        for r in range(n)
    ]
    lines.append(
        "all-gather: "
        + "  ".join(f"{name} {n * spec.padded_shard_numel(shape, n)} -> {_shape_text(shape)}" for name, shape in shapes)
    )
    return lines


def nine_rows_on_four(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """The guide's model on four ranks, row for row: each rank's local shapes, elements and bytes (distinct live
    storages), then each parameter's all-gather output (elements) and unsharded shape. The same rows are also
    written from the spec alone, and must agree."""
    n = ctx.world_size
    module = wrap(ctx, NINE)
    fsdp_params = by_fqn(module, NINE)
    lines = [entry["line"] for entry in ctx.gather(_nine_lines(module, n, ctx.rank))]
    module.unshard()
    gathered = {
        name: (fsdp_params[name].all_gather_outputs[0].numel(), tuple(module.get_parameter(name).shape))
        for name in ("w", "b", "e", "z")
    }
    module.reshard()
    lines.append(
        "all-gather: "
        + "  ".join(f"{name} {numel} -> {_shape_text(shape)}" for name, (numel, shape) in gathered.items())
    )
    # Each row as written, its two-space gaps included; the details keep the row's index and the observed line.
    for i, (seen, row) in enumerate(zip(lines, expected, strict=False)):
        expected.require(seen == row.text, row, "layout-differs", f"line {i}: {seen!r} vs {row.text!r}", line=i,
                         observed=seen, expected=row.text)  # fmt: skip
    if len(lines) != len(expected):
        unmatched = expected.rows[min(len(lines), len(expected) - 1)]
        expected.fail(unmatched, "layout-differs", f"number of lines: {len(lines)!r}, expected {len(expected)!r}",
                      observed=len(lines), expected=len(expected))  # fmt: skip
    require_equal(lines, _spec_lines(n), reason="spec-differs", what="the lines the spec gives")
    return {
        "lines": lines,
        "w_local": [line.split(": ")[1].split()[1] for line in lines[:n]],
        "bytes": [int(line.split(" in ")[1].split()[0]) for line in lines[:n]],
        "bytes_text": [line.split(" in ")[1].split()[0] for line in lines[:n]],
        "w_gathered": gathered["w"][0],
    }
