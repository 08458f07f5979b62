"""What ``_auto_wrap`` refuses: a tree that already holds an FSDP module, under any policy."""

from __future__ import annotations

from typing import Any

from checks.guides.g20_auto_wrap.wrapping import error_line, wrap_fsdp1
from checks.ranks.context import RankContext
from checks.violation import require_equal
from checks.workloads.edge import build
from checks.workloads.module_tree import module_paths
from checks.workloads.wrap_policies import torch_policy


def nested_wrapping_refused(ctx: RankContext, policies: list[dict[str, Any]], message: str) -> dict[str, Any]:
    """With ``blocks.0`` already an FSDP module, ``FSDP(model, auto_wrap_policy=...)`` raises ValueError from
    ``_check_nested_wrapping`` naming it, for a _Policy and a callable alike; without a policy the same nesting
    is plain manual wrapping and builds."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    seen = {}
    for spec in [*policies, None]:
        model = build("gpt", ctx.device)
        paths = module_paths(model)
        model.blocks[0] = FSDP(model.blocks[0], device_id=ctx.device, use_orig_params=True)
        kind = spec["kind"] if spec else "none"
        try:
            wrap_fsdp1(model, ctx, torch_policy(spec, paths), paths)
        except Exception as error:
            seen[kind] = error_line(error)
        else:
            seen[kind] = "built"
    expected = {spec["kind"]: f"ValueError: {message}" for spec in policies} | {"none": "built"}
    require_equal(seen, expected, reason="nesting-not-refused", what="what each wrap of an already-wrapped child did")
    return {"outcomes": seen}
