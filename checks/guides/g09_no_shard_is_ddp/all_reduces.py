"""Guide 09's communication: NO_SHARD issues one all-reduce per unit in backward and nothing else, of the unit's
flat-parameter length, which still ends in padding to a multiple of the world size."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from checks.guides.g09_no_shard_is_ddp.replicas import LR, build_replica, distinct_ratios, no_shard_gpt
from checks.models.divide_factors import predivide
from checks.models.flat_param import FlatLayout, FlatParamSpec, Param, flat_param, layout
from checks.naming import ROOT
from checks.probes.comm import record_comm
from checks.probes.expect import assert_sequence
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.gpt import batch, post_backward_order, unit_numels, unit_of_parameter, units
from checks.workloads.toy import TOY_LAYERS, toy_batch, toy_model, train_step, wrap_fsdp1
from mini_gpt.train import make_optimizer

# The order the units' post-backward hooks fire in, so the order of their all-reduces: the blocks in reverse, then
# the root, whose embedding (used first in forward, and again by the tied head) gets its gradient last (guide 01).
BACKWARD_ORDER = ("blocks.2", "blocks.1", "blocks.0", ROOT)
REDUCER = "torch.distributed.fsdp._runtime_utils:_reduce_grad_no_shard"


def _layouts(world_size: int) -> dict[str, FlatLayout]:
    """Each unit's flat parameter under NO_SHARD, from the model's parameter sizes. With use_orig_params=True it
    is padded to a multiple of the world size like any other strategy's (`tiny`'s units divide by 2 and 4)."""
    return {name: layout(numels, 4, world_size, sharded=False) for name, numels in unit_numels().items()}


def _local_flat_grads(replica: torch.nn.Module, layouts: dict[str, FlatLayout]) -> dict[str, torch.Tensor]:
    """The replica's gradients laid out as each unit's flat gradient (registration order, alignment gaps and
    world-size padding zero)."""
    flat = {name: torch.zeros(lay.padded_numel) for name, lay in layouts.items()}
    placed = dict.fromkeys(layouts, 0)
    for name, param in replica.named_parameters():  # registration order, the tied head skipped
        unit = unit_of_parameter(name, layouts)
        start = layouts[unit].starts[placed[unit]]
        flat[unit][start : start + param.numel()] = param.grad.detach().flatten().cpu()
        placed[unit] += 1
    return flat


class _AllReduceInputs(TorchDispatchMode):
    """Copies each all-reduce's input as it is issued (before the collective runs; its output is not waited for
    here, so it is never read)."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs: list[torch.Tensor] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func._schema.name == "c10d::allreduce_":
            self.inputs.append(args[0][0].detach().clone().cpu())
        return func(*args, **(kwargs or {}))


# -- claim: only all-reduces, one per unit ----------------------------------------------------------------------------
def all_reduces_only(ctx: RankContext, steps: int = 2) -> dict[str, Any]:
    """Each step (forward, backward, optimizer) issues one all-reduce per unit and nothing else, all in backward,
    in post-backward order, each of the unit's whole flat-gradient length, fp32, over all ranks, from
    `_reduce_grad_no_shard`; the first one carries the local gradient divided by the predivide factor."""
    model = no_shard_gpt(ctx)
    optim = make_optimizer(model, LR)
    layouts = _layouts(ctx.world_size)
    expected_sizes = [layouts[name].padded_numel for name in BACKWARD_ORDER]
    observed: dict[str, Any] = {}
    for step in range(steps):
        x, y = batch(ctx, step=step)
        with record_comm() as comm, _AllReduceInputs() as captured:
            _, loss = model(x, y)
            loss.backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
        where = f"step {step + 1}"
        counts = {t.op: t.count for t in comm.totals(objects=None)}
        require_equal(sorted(counts), ["all_reduce"], reason="not-only-all-reduce", what=f"{where}: collective kinds",
                      counts=counts, step=step + 1)  # fmt: skip
        outside = [c.describe() for c in comm if not c.in_backward]
        require(not outside, "collective-outside-backward", f"{where}: collectives outside backward: {outside}",
                observed=outside, step=step + 1)  # fmt: skip
        sizes = [c.numel for c in comm.select("all_reduce")]
        assert_sequence(sizes, expected_sizes, what=f"{where}: all-reduce lengths", reason="all-reduce-sizes")
        callers = sorted({c.caller for c in comm})
        require_equal(callers, [REDUCER], reason="all-reduce-caller", what=f"{where}: callers", step=step + 1)
        shape = sorted({(c.dtype, c.group_size) for c in comm})
        require_equal(shape, [("torch.float32", ctx.world_size)], reason="all-reduce-dtype-or-group",
                      what=f"{where}: (dtype, group size)", step=step + 1)  # fmt: skip
        if step == 0:
            observed = {"collectives": len(comm), "sizes": sizes}
            observed["predivide"] = _predivide_of_first_step(ctx, captured.inputs, layouts)
    return observed


def _predivide_of_first_step(ctx: RankContext, inputs: list[torch.Tensor], layouts: dict[str, FlatLayout]) -> float:
    """What step 1's all-reduces carry, against the replica's local gradient on the same batch: one exact ratio,
    the divide-factor model's predivide for this world size."""
    replica = build_replica(ctx)
    _, loss = replica(*batch(ctx, step=0))
    loss.backward()
    local = _local_flat_grads(replica, layouts)
    ratios: set[float] = set()
    for name, sent in zip(BACKWARD_ORDER, inputs, strict=True):
        mismatched = int(((sent == 0) != (local[name] == 0)).sum())
        require(mismatched == 0, "zeros-differ", f"{name}: {mismatched} elements are zero in only one of the "
                "all-reduce input and the local gradient", unit=name, observed=mismatched)  # fmt: skip
        ratios.update(distinct_ratios(local[name], sent))
    require_equal(sorted(ratios), [predivide(ctx.world_size)], reason="wrong-predivide",
                  what="local gradient / all-reduce input, over every element")  # fmt: skip
    return ratios.pop()


# -- claim: NO_SHARD still pads for the world size -----------------------------------------------------------------
def _toy_specs(world_size: int) -> dict[str, FlatParamSpec]:
    """The toy's units under NO_SHARD with use_orig_params=True, by the flat-parameter model: children "0" and
    "1" are units, and the root keeps child "2", Linear(5, 5), whose 25 + 5 elements are 33 once aligned."""
    owners = {"0": "0", "1": "1", ROOT: "2"}
    specs = {}
    for unit, child in owners.items():
        in_features, out_features = TOY_LAYERS[int(child)]
        params = [Param(f"{child}.weight", (out_features, in_features)), Param(f"{child}.bias", (out_features,))]
        specs[unit] = flat_param(params, world_size, use_orig_params=True, sharded=False)
    return specs


def _flat_param_facts(flat: Any) -> dict[str, Any]:
    return {"numel": flat.numel(), "segments": list(flat._numels_with_padding), "padding": list(flat._is_padding_mask)}


def no_shard_pads_for_world_size(ctx: RankContext) -> dict[str, Any]:
    """With use_orig_params=True a NO_SHARD unit's flat parameter ends in padding to a multiple of the world size,
    as a sharded one does, and each backward all-reduces the padded length. The toy's units (31, 41 and 33
    elements once aligned) divide by neither 2 nor 4."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the deprecation is its own claim's subject
        model = wrap_fsdp1(toy_model(ctx.device), ctx, strategy="NO_SHARD", use_orig_params=True)
    specs = _toy_specs(ctx.world_size)
    built = {name: _flat_param_facts(unit._handle.flat_param) for name, unit in units(model).items()}
    expected = {
        name: {"numel": s.flat_numel, "segments": list(s.numels_with_padding), "padding": list(s.is_padding_mask)}
        for name, s in specs.items()
    }
    require_equal(built, expected, reason="flat-param-padding", what="each unit's flat parameter")
    with record_comm() as comm:
        train_step(model, None, toy_batch(ctx))
    order = post_backward_order(("0", "1", ROOT))
    sizes = [c.numel for c in comm.select("all_reduce")]
    assert_sequence(sizes, [specs[name].flat_numel for name in order], what="all-reduce lengths",
                    reason="all-reduce-sizes")  # fmt: skip
    return {
        "aligned": {name: s.params_end for name, s in specs.items()},
        "flat_numel": {name: s.flat_numel for name, s in specs.items()},
        "all_reduces": dict(zip(order, sizes, strict=True)),
    }
