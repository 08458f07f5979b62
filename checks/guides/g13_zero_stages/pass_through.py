"""Guide 13's pass-through claim: the reference ZeRO-3 (`checks.zero.zero3`) on a model whose blocks return one of
their inputs (`checks.workloads.pass_through`, T5's ``position_bias``) gathers each block once in forward and
once in backward, reduces each group once, holds no whole parameters after the step, and gives DDP's gradients.

Expected values come from outside the engine: the collectives from ``estimate``'s model of ZeRO-3
(`checks.models.cost.collectives`), the gradients from DDP on the same weights and batches (one sum on two ranks:
bitwise), and no whole parameter left (the guide's prose).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import torch
from torch import nn

from checks.models import cost
from checks.models.zero_memory import Param
from checks.naming import ROOT
from checks.probes.comm import record_comm
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.data_parallel import make
from checks.workloads.pass_through import BLOCKS, batch, pass_through

LR = 1e-3


def _model() -> nn.Module:
    torch.manual_seed(0)
    return pass_through()


def _batch(ctx: RankContext) -> torch.Tensor:
    torch.manual_seed(1000 + ctx.rank)
    return batch()


def expected_collectives(world_size: int) -> Counter[tuple[str, str, int]]:
    """(op, phase, elements) of one ZeRO-3 step, from ``estimate``'s model over the model's groups."""
    model = pass_through()
    params = [Param(next((b for b in BLOCKS if n.startswith(b + ".")), ROOT), n, tuple(p.shape))
              for n, p in model.named_parameters()]  # fmt: skip
    ops = cost.collectives(cost.Plan(tuple(params), world_size, "zero3", root=ROOT)).ops
    return Counter((o.op, "backward" if o.backward else "forward", o.numel) for o in ops)


def zero3_pass_through(ctx: RankContext) -> dict[str, Any]:
    """One step of the reference ZeRO-3 and one of DDP on the pass-through model (see the module docstring)."""
    from functools import partial

    from torch.nn.parallel import DistributedDataParallel as DDP

    from checks.zero import STAGES

    engine = STAGES[3](_model(), list(BLOCKS), make_optimizer=partial(make, "adamw", lr=LR))
    x = _batch(ctx)
    with record_comm() as comm:
        engine.model(x).sum().backward()
    seen = Counter((c.op, "backward" if c.in_backward else "forward", c.numel) for c in comm
                   if c.op in ("all_gather", "reduce_scatter"))  # fmt: skip
    want = expected_collectives(ctx.world_size)
    extra, lacking = seen - want, want - seen
    require(not extra and not lacking, "collectives-differ", f"ZeRO-3's step: extra {dict(extra)}, lacking "
            f"{dict(lacking)}", extra=sorted(extra.items()), lacking=sorted(lacking.items()))  # fmt: skip
    whole = {g.name: g.full.untyped_storage().nbytes() for g in engine.groups if g.name != ROOT}
    require_equal(whole, dict.fromkeys(BLOCKS, 0), reason="left-unsharded",
                  what="bytes of whole parameters held after backward, per block")  # fmt: skip
    grads = engine.full_grads()
    ddp = DDP(_model())
    ddp(x).sum().backward()
    want_grads = {n: p.grad for n, p in ddp.module.named_parameters()}
    differing = [n for n, g in want_grads.items() if not torch.equal(grads[n], g)]
    if ctx.world_size == 2:
        require(not differing, "differs-from-ddp", f"{len(differing)} gradients differ from DDP's: {differing}",
                differing=differing)  # fmt: skip
    gathers = _gathers_per_phase(seen)
    fsdp1 = _gathers_per_phase(_fsdp1_step(ctx, x))
    require_equal(fsdp1, _gathers_per_phase(want), reason="fsdp1-differs", what="FSDP1 FULL_SHARD's all-gathers "
                  "per phase on the same model")  # fmt: skip
    return {
        "all-gathers": gathers,
        "FSDP1 all-gathers": fsdp1,
        "reduce-scatters": sum(v for (op, _, _), v in seen.items() if op == "reduce_scatter"),
        "whole bytes after backward": sum(whole.values()),
        "gradients bitwise DDP's": f"{len(want_grads) - len(differing)} of {len(want_grads)}",
        "elements": sum(math.prod(p.shape) for p in ddp.module.parameters()),
    }


def _gathers_per_phase(ops: Counter[tuple[str, str, int]]) -> dict[str, int]:
    return {phase: sum(v for (op, ph, _), v in ops.items() if op == "all_gather" and ph == phase)
            for phase in ("forward", "backward")}  # fmt: skip


def _fsdp1_step(ctx: RankContext, x: torch.Tensor) -> Counter[tuple[str, str, int]]:
    """FSDP1 FULL_SHARD, a unit per block and the root, one forward and backward: its collectives."""
    import warnings

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from checks.workloads.pass_through import BiasBlock

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = FSDP(_model(), auto_wrap_policy=ModuleWrapPolicy({BiasBlock}), use_orig_params=True,
                     device_id=ctx.device)  # fmt: skip
    with record_comm() as comm:
        model(x).sum().backward()
    return Counter((c.op, "backward" if c.in_backward else "forward", c.numel) for c in comm
                   if c.op in ("all_gather", "reduce_scatter"))  # fmt: skip
