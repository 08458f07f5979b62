"""What every claim of guide 06 builds and reads: the three modes, the workloads with the post-forward order their
structure implies, one backward's hooks, and torch's post-forward record."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import BackwardPrefetch

from checks.models.prefetch import backward_sequence
from checks.naming import ROOT
from checks.probes.event_log import EventLog
from checks.ranks.context import RankContext
from checks.workloads import nested_units, toy
from checks.workloads.gpt import batch, fsdp1_gpt, units

MODES: tuple[str | None, ...] = ("BACKWARD_PRE", "BACKWARD_POST", None)
# Post-forward order implied by each workload's structure: the blocks (or the toy's children) in forward order, the
# root, whose forward ends last and whose own layers produce the output, last.
# The nested workload's units end their forwards inside their parents' (`checks.workloads.nested_units`).
POST_FORWARD = {"gpt": ("blocks.0", "blocks.1", "blocks.2", ROOT), "toy": ("0", "1", ROOT),
                "nested": nested_units.POST_FORWARD}  # fmt: skip
PARENTS = {"nested": nested_units.PARENTS}  # each nested unit's enclosing unit
HOOK_KINDS = ("pre_backward", "post_backward", "prefetch")


def label(mode: str | None) -> str:
    """The mode as the guide's tables name it (``None`` for no backward prefetch)."""
    return mode or "None"


def policy(mode: str | None) -> BackwardPrefetch | None:
    return BackwardPrefetch[mode] if mode else None


def build(ctx: RankContext, workload: str, mode: str | None, **kwargs: object) -> nn.Module:
    if workload == "gpt":
        return fsdp1_gpt(ctx, backward_prefetch=policy(mode), **kwargs)
    if workload == "nested":
        return _nested(ctx, mode)
    return toy.wrap_fsdp1(toy.toy_model(ctx.device), ctx, backward_prefetch=mode, **kwargs)


def _nested(ctx: RankContext, mode: str | None) -> nn.Module:
    """FSDP1 FULL_SHARD over `checks.workloads.nested_units`, a unit per Outer and per Inner, from seed 0."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    torch.manual_seed(0)
    model = nested_units.parent_and_children().to(ctx.device)
    policy_ = ModuleWrapPolicy({nested_units.Outer, nested_units.Inner})
    return FSDP(model, auto_wrap_policy=policy_, backward_prefetch=policy(mode), device_id=ctx.device)


def loss_of(ctx: RankContext, workload: str, model: nn.Module) -> torch.Tensor:
    """One forward of the workload's batch, to the loss its backward starts from."""
    if workload == "gpt":
        return model(*batch(ctx))[1]
    if workload == "nested":
        torch.manual_seed(1000 + ctx.rank)
        return model(torch.randn(2, nested_units.WIDTH, device=ctx.device)).sum()
    return model(toy.toy_batch(ctx)).sum()


def handle_names(model: nn.Module) -> dict[int, str]:
    """Unit name by ``id`` of its handle, to name what torch's record holds."""
    return {id(unit._handle): name for name, unit in units(model).items() if unit._handle is not None}


def recorded_post_forward(model: nn.Module) -> tuple[list[str], dict[str, int | None]]:
    """Torch's post-forward record now: the root's ``handles_post_forward_order`` as unit names, and each unit's
    ``_post_forward_index``."""
    names = handle_names(model)
    eod = model._exec_order_data
    order = [names[id(handle)] for handle in eod.handles_post_forward_order]
    index = {names[id(handle)]: handle._post_forward_index for handle in eod.all_handles}
    return order, index


def hook_sequence(events: EventLog) -> list[str]:
    return [e.describe() for e in events if e.kind in HOOK_KINDS]


def model_prefetches(post_forward: tuple[str, ...], mode: str | None) -> list[str]:
    """The rule model's prefetches for ``mode``, as ``issuer→target``."""
    return [
        line.removeprefix("prefetch ") for line in backward_sequence(post_forward, mode) if line.startswith("prefetch")
    ]
