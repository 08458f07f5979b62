"""Property (b), all-gather-reconstructs-at-2 and -at-4: the all-gather's copy-in, the collective and the
copy-out, the unsharded parameter that views its output, and the reshard that puts the DTensor back."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from checks.guides.g16_fsdp2_per_parameter_sharding.fsdp_params import (
    by_fqn,
    fsdp_modules,
    fsdp_params_of,
    param_groups_of,
    storage_of,
    wrap,
)
from checks.guides.g16_fsdp2_per_parameter_sharding.replica_rows import as_bytes, expected_padded, require_same
from checks.models import fsdp2_shards as spec
from checks.models.fsdp2_draws import describe, groups_of, params_of
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.drawn_fsdp2 import build


def _check_gathered_input(output: torch.Tensor, fqns: list[str], model: dict[str, Any], n: int) -> None:
    """Rule 4: the all-gather output is N inputs, rank by rank; each the padded chunks of the group, in order."""
    shapes = dict((fqn, shape) for fqn, shape, _ in params_of(model))
    replica = build(model)
    rows = output.view(n, -1)
    for r in range(n):
        expected = [as_bytes(expected_padded(replica, fqn, shapes[fqn], n, r)) for fqn in fqns]
        whole = torch.cat(expected) if expected else torch.zeros(0, dtype=torch.uint8)
        observed = as_bytes(rows[r]) if rows[r].dtype != torch.uint8 else rows[r]
        require_same(observed, whole, reason="all-gather-input-differs", what=f"rank {r}'s all-gather input", rank=r)


def check_unsharded(
    module: nn.Module, fsdp_params: dict[str, Any], fqns: list[str], model: dict[str, Any], n: int
) -> None:
    """After an unshard: each output N padded chunks (copy-out), the module's parameter a plain tensor, the group's
    ``_unsharded_param``, bitwise the replica's and a view of that output."""
    shapes = {fqn: shape for fqn, shape, _ in params_of(model)}
    replica = build(model)
    for fqn in fqns:
        shape, fsdp_param = shapes[fqn], fsdp_params[fqn]
        outputs = fsdp_param.all_gather_outputs
        require_equal(len(outputs), 1, reason="all-gather-outputs-differ", what=f"{fqn} all_gather_outputs")
        padded = spec.padded_shard_numel(shape, n)
        require_equal(
            outputs[0].numel(), n * padded, reason="all-gather-output-numel-differs", what=f"{fqn} all-gather output"
        )
        for r in range(n):
            require_same(
                outputs[0].view(n, -1)[r] if padded else outputs[0][:0],
                expected_padded(replica, fqn, shape, n, r),
                reason="copy-out-differs",
                what=f"{fqn}'s rows from rank {r}",
            )
        param = module.get_parameter(fqn)
        require(not isinstance(param, DTensor), "still-sharded", f"{fqn} is a DTensor after unshard", fqn=fqn)
        require(param is fsdp_param._unsharded_param, "not-the-unsharded-param", f"{fqn}", fqn=fqn)
        require_same(param, replica.get_parameter(fqn).detach(), reason="unsharded-param-differs", what=fqn)
        if param.numel():
            require(
                storage_of(param)[0] == storage_of(outputs[0])[0],
                "unsharded-not-a-view",
                f"{fqn} is not a view of its all-gather output",
                fqn=fqn,
            )


def _check_resharded(module: nn.Module, fsdp_params: dict[str, Any], fqns: list[str]) -> None:
    for fqn in fqns:
        fsdp_param = fsdp_params[fqn]
        require(module.get_parameter(fqn) is fsdp_param.sharded_param, "not-resharded", f"{fqn}", fqn=fqn)
        sizes = [t.untyped_storage().nbytes() for t in fsdp_param.all_gather_outputs]
        require(all(s == 0 for s in sizes), "unsharded-not-freed", f"{fqn} keeps {sizes} bytes", fqn=fqn)


def all_gather_reconstructs(ctx: RankContext, example: dict[str, Any]) -> dict[str, Any]:
    """Property (b): for each group, ``unshard`` all-gathers one buffer whose row r is rank r's padded chunks in
    parameter order (copy-in); each parameter's all-gather output holds every rank's chunk (copy-out), and the
    module's parameter is then a plain tensor, a view of that output, bitwise the replica's; ``reshard`` puts the
    sharded DTensor back and frees the output."""
    module, n = wrap(ctx, example), ctx.world_size
    fsdp_params = by_fqn(module, example)
    gathered: dict[str, int] = {}
    for prefix, sub in fsdp_modules(module, example).items():
        fqns = groups_of(example)[prefix]
        handle = sub.unshard(async_op=True)
        results = [g._all_gather_result for g in param_groups_of(sub)]
        for result in results:
            if result is not None and result.all_gather_work is not None:
                result.all_gather_work.wait()
        outputs = [r.all_gather_output for r in results if r is not None]
        handle.wait()
        order = [fqn for fsdp_param in fsdp_params_of(sub) for fqn in fqns if fsdp_params[fqn] is fsdp_param]
        ctx.agreed(_check_gathered_input, outputs[0], order, example, n)
        ctx.agreed(check_unsharded, module, fsdp_params, fqns, example, n)
        gathered[prefix or "root"] = outputs[0].numel() * outputs[0].element_size()
        sub.reshard()
        ctx.agreed(_check_resharded, module, fsdp_params, fqns)
    return {"model": describe(example), "all_gather_bytes": gathered}
