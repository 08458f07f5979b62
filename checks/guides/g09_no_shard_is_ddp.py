"""Checks for guide 09, NO_SHARD is DDP: what FSDP1 communicates when it does not shard, and whether training then
matches DistributedDataParallel bit for bit.

Every expected value comes from outside FSDP: flat-parameter and all-reduce sizes from the flat-parameter layout
model (`checks.models.flat_param`, NO_SHARD's world-size padding included) over the model's own parameter sizes,
divide factors from the divide-factor model (`checks.models.divide_factors`), local gradients from an unwrapped
replica of the same model on the same batch, and the reference training run from DDP.
The warnings are compared with the text the guide quotes in its expect blocks.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.utils._python_dispatch import TorchDispatchMode

from checks.models.divide_factors import postdivide, predivide
from checks.models.flat_param import FlatLayout, FlatParamSpec, Param, flat_param, layout
from checks.naming import ROOT, clean
from checks.numerics import pairwise_sums
from checks.probes import assert_sequence, record_comm
from checks.ranks import codeswap, tracing
from checks.ranks.codeswap import code_of
from checks.ranks.context import RankContext
from checks.ranks.symbols import code_objects
from checks.violation import require, require_equal
from checks.workloads.gpt import batch, fsdp1_gpt, post_backward_order, unit_numels, unit_of_parameter, units
from checks.workloads.groups import one_rank_group
from checks.workloads.toy import TOY_LAYERS, toy_batch, toy_model, train_step, wrap_ddp, wrap_fsdp1
from mini_gpt import GPT, preset
from mini_gpt.train import make_optimizer

LR = 1e-3
# The order the units' post-backward hooks fire in, so the order of their all-reduces: the blocks in reverse, then
# the root, whose embedding (used first in forward, and again by the tied head) gets its gradient last (guide 01).
BACKWARD_ORDER = ("blocks.2", "blocks.1", "blocks.0", ROOT)
REDUCER = "torch.distributed.fsdp._runtime_utils:_reduce_grad_no_shard"
_FSDP_INIT = "torch.distributed.fsdp.fully_sharded_data_parallel:FullyShardedDataParallel.__init__"
_INIT_CORE_STATE = "torch.distributed.fsdp._init_utils:_init_core_state"


# -- building ------------------------------------------------------------------------------------------------------
def _no_shard_gpt(ctx: RankContext, **kwargs: Any) -> FSDP:
    """mini_gpt tiny as four NO_SHARD units; the deprecation warning is the subject of its own claim only."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy.NO_SHARD, **kwargs)


def _replica(ctx: RankContext) -> GPT:
    """The same model, same seed, unwrapped: the reference for local gradients and for DDP."""
    return GPT(preset("tiny"), seed=0).to(ctx.device)


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


def _ratios(numerator: torch.Tensor, denominator: torch.Tensor) -> list[float]:
    """The distinct values of numerator / denominator where the denominator is not zero."""
    keep = denominator != 0
    return sorted(torch.unique(numerator[keep] / denominator[keep]).tolist())


# -- claim: only all-reduces, one per unit ----------------------------------------------------------------------------
def all_reduces_only(ctx: RankContext, steps: int = 2) -> dict[str, Any]:
    """Each step (forward, backward, optimizer) issues one all-reduce per unit and nothing else, all in backward,
    in post-backward order, each of the unit's whole flat-gradient length, fp32, over all ranks, from
    `_reduce_grad_no_shard`; the first one carries the local gradient divided by the predivide factor."""
    model = _no_shard_gpt(ctx)
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
    replica = _replica(ctx)
    _, loss = replica(*batch(ctx, step=0))
    loss.backward()
    local = _local_flat_grads(replica, layouts)
    ratios: set[float] = set()
    for name, sent in zip(BACKWARD_ORDER, inputs, strict=True):
        mismatched = int(((sent == 0) != (local[name] == 0)).sum())
        require(mismatched == 0, "zeros-differ", f"{name}: {mismatched} elements are zero in only one of the "
                "all-reduce input and the local gradient", unit=name, observed=mismatched)  # fmt: skip
        ratios.update(_ratios(local[name], sent))
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


# -- claims: training against DDP --------------------------------------------------------------------------------------
def _train_side_by_side(ctx: RankContext, steps: int, lr: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Train the NO_SHARD model and a DDP model from the same weights on the same per-rank batches. Per step: the
    two losses and which parameters differ (by name, bitwise) after the optimizer step. Also both models'
    gradients after the first backward, flattened in the replica's parameter order."""
    fsdp = _no_shard_gpt(ctx)
    ddp = wrap_ddp(_replica(ctx), ctx)
    start = {name: p.detach().clone() for name, p in ddp.module.named_parameters()}
    optims = make_optimizer(fsdp, lr), make_optimizer(ddp, lr)
    records: list[dict[str, Any]] = []
    first: dict[str, Any] = {}
    for step in range(steps):
        x, y = batch(ctx, step=step)
        losses = []
        for model in (fsdp, ddp):
            with record_comm() as comm:
                _, loss = model(x, y)
                loss.backward()
            losses.append(loss.detach())
        ddp_all_reduces = [c.numel for c in comm.select("all_reduce")]
        ours = {clean(name): p for name, p in fsdp.named_parameters()}
        theirs = dict(ddp.module.named_parameters())
        require_equal(sorted(ours), sorted(theirs), reason="parameter-names", what="parameter names")
        if step == 0:
            first = {
                "names": list(theirs),
                "fsdp": torch.cat([ours[n].grad.detach().flatten().cpu() for n in theirs]),
                "ddp": torch.cat([theirs[n].grad.detach().flatten().cpu() for n in theirs]),
            }
        for optim in optims:
            optim.step()
            optim.zero_grad(set_to_none=True)
        differing = [name for name in theirs if not torch.equal(ours[name], theirs[name])]
        gap = torch.cat([(ours[n] - theirs[n]).detach().abs().flatten().cpu() for n in theirs])
        records.append(
            {
                "step": step + 1,
                "loss": [float(v) for v in losses],
                "loss_equal": bool(torch.equal(*losses)),
                "ddp_all_reduces": ddp_all_reduces,
                "differing": differing,
                "max_abs_diff": float(gap.max()),
                "argmax": int(gap.argmax()),  # in the replica's parameter order, like first["fsdp"]
                "moved": max(float((theirs[n].detach() - start[n]).abs().max()) for n in theirs),
            }
        )
    return records, first


def matches_ddp_bitwise(ctx: RankContext, steps: int = 5, lr: float = LR) -> dict[str, Any]:
    """NO_SHARD and DDP give the same losses and the same parameters, bit for bit, after every step."""
    records, _ = _train_side_by_side(ctx, steps, lr)
    whole = sum(sum(numels) for numels in unit_numels().values())  # every parameter once, no alignment gaps
    for record in records:
        step = record["step"]
        require_equal(record["ddp_all_reduces"], [whole], reason="ddp-not-one-bucket",
                      what=f"step {step}: DDP's all-reduce lengths", step=step)  # fmt: skip
        require(record["loss_equal"], "loss-differs", f"step {step}: losses {record['loss']} (NO_SHARD, DDP)",
                step=step, observed=record["loss"])  # fmt: skip
        differing = record["differing"]
        message = f"after step {step}, {len(differing)} parameters differ from DDP's, by up to {record['max_abs_diff']}"
        require(not differing, "differs-from-ddp", message, step=step, differing=differing,
                max_abs_diff=record["max_abs_diff"])  # fmt: skip
    return {
        "steps": steps,
        "bitwise": True,
        "differing": [len(r["differing"]) for r in records],
        "ddp_all_reduces": records[0]["ddp_all_reduces"],
        "moved": records[-1]["moved"],
    }


def within_bound_of_ddp(ctx: RankContext, bound: float, steps: int = 5, lr: float = LR) -> dict[str, Any]:
    """On more than two ranks the two all-reduces may add the ranks' gradients in different orders. After the first
    backward, each side's gradient times N must be one of the fp32 pairwise sums of the ranks' local gradients
    (the replica's, gathered); over the run, parameters and losses must stay within ``bound`` of DDP's."""
    n = ctx.world_size
    if n & (n - 1):
        raise ValueError(f"{n} ranks: multiplying the mean back by N is exact only for a power of two")
    records, first = _train_side_by_side(ctx, steps, lr)
    replica = _replica(ctx)
    _, loss = replica(*batch(ctx, step=0))
    loss.backward()
    params = dict(replica.named_parameters())
    local = torch.cat([params[name].grad.detach().flatten().cpu() for name in first["names"]])
    everyone = [torch.empty_like(local) for _ in range(n)]
    dist.all_gather(everyone, local)
    sums = torch.stack(pairwise_sums(everyone))
    for side in ("fsdp", "ddp"):
        explained = (sums == first[side] * n).any(dim=0)
        unexplained = int((~explained).sum())
        message = f"{side}: {unexplained} gradient elements × {n} are no fp32 sum of the {n} local gradients"
        require(unexplained == 0, "not-a-summation-order", message, side=side, observed=unexplained)
    grad_diff = (first["fsdp"] - first["ddp"]).abs()
    larger = torch.maximum(first["fsdp"].abs(), first["ddp"].abs())
    relative = grad_diff[grad_diff > 0] / larger[grad_diff > 0]
    at = records[0]["argmax"]  # the element that moved apart most in step 1, and its gradient
    worst = [r["max_abs_diff"] for r in records]
    loss_diff = max(abs(a - b) for a, b in (r["loss"] for r in records))
    for record in records:
        message = f"after step {record['step']}: max |param - DDP's| = {record['max_abs_diff']} > {bound}"
        require(record["max_abs_diff"] <= bound, "beyond-bound", message, step=record["step"],
                observed=record["max_abs_diff"], bound=bound)  # fmt: skip
    require(loss_diff <= bound, "loss-beyond-bound", f"max |loss - DDP's| = {loss_diff} > {bound}",
            observed=loss_diff, bound=bound)  # fmt: skip
    bitwise = not any(worst) and loss_diff == 0
    return {
        "verdict": "bitwise equal" if bitwise else "not bitwise equal",
        "grad_elements": local.numel(),
        "grad_elements_differing": int((grad_diff > 0).sum()),
        "grad_max_abs_diff": float(grad_diff.max()),
        "grad_max_rel_diff": float(relative.max()) if relative.numel() else 0.0,
        "step_1_worst": {"param_diff": worst[0], "grad": float(first["ddp"][at]), "grad_diff": float(grad_diff[at])},
        "max_abs_diff": worst,
        "loss_max_abs_diff": loss_diff,
        "moved": records[-1]["moved"],
    }


# -- claims: how NO_SHARD is chosen, and what it says ------------------------------------------------------------
@contextlib.contextmanager
def _recorded_warnings() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def _messages(caught: list[warnings.WarningMessage]) -> list[str]:
    return [f"{w.category.__name__}: {w.message}" for w in caught]


def _where(filename: str, line: int) -> str:
    return f"{Path(filename).name}:{line}"


@contextlib.contextmanager
def _call_sites(symbol: str, within: str | None = None) -> Iterator[list[str]]:
    """``file:line`` where ``symbol`` was called, once per call in the block: the calling frame's line, or with
    ``within`` the line the nearest frame running ``within`` is at (so a wrapper in between does not move it).
    A tracer on the code reads it, without the warnings machinery."""
    sites: list[str] = []
    enclosing = set(code_objects(within)) if within else None

    def on_call(frame: Any) -> None:
        caller = frame.f_back
        while enclosing is not None and caller is not None and code_of(caller) not in enclosing:
            caller = caller.f_back
        sites.append(_where(caller.f_code.co_filename, caller.f_lineno) if caller else "?")

    with tracing.subscribed(dict.fromkeys(code_objects(symbol), on_call)) as subscription:
        yield sites
    if subscription.errors:
        raise RuntimeError(f"the call-site recorder failed: {subscription.errors[0]!r}") from subscription.errors[0]


def deprecation_warning_at_construction(ctx: RankContext, expected: list[str]) -> dict[str, Any]:
    """Building each NO_SHARD unit on more than one rank warns once, a FutureWarning with the text of the guide's
    expect block, attributed to the line that called FullyShardedDataParallel; forward and backward warn nothing."""
    text = " ".join(expected)
    with _recorded_warnings() as built, _call_sites(_FSDP_INIT) as built_at:
        model = fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy.NO_SHARD)
    matching = [w for w in built if str(w.message) == text]
    message = f"{len(matching)} warnings with the guide's text for {len(units(model))} units; got {_messages(built)}"
    require(len(matching) == len(units(model)), "deprecation-count", message, observed=len(matching),
            expected=len(units(model)), warnings=_messages(built))  # fmt: skip
    categories = sorted({w.category.__name__ for w in matching})
    require_equal(categories, ["FutureWarning"], reason="wrong-category", what="the deprecation warning's category")
    # stacklevel=3 is meant to name the caller of FullyShardedDataParallel(...): each unit's own construction line
    # in the workload's file, the blocks' line three times, then the root's.
    caller = Path(inspect.getsourcefile(fsdp1_gpt) or "").name
    require(all(site.startswith(f"{caller}:") for site in built_at), "units-built-elsewhere",
            f"units were built at {built_at}, not in {caller}", observed=built_at)  # fmt: skip
    points_at = [_where(w.filename, w.lineno) for w in matching]
    require_equal(points_at, built_at, reason="warning-location", what="the lines the deprecation warnings name")
    with _recorded_warnings() as later:
        _, loss = model(*batch(ctx))
        loss.backward()
    require(not later, "warns-after-construction", f"forward and backward warned: {_messages(later)}",
            observed=_messages(later))  # fmt: skip
    return {"category": categories[0], "count": len(matching), "message": text, "points_at": points_at}


def world_size_1_clamps_to_no_shard(ctx: RankContext, expected: list[str]) -> dict[str, Any]:
    """Over a one-rank process group, the default FULL_SHARD becomes NO_SHARD with a UserWarning (the guide's
    expect block) and no deprecation warning; every all-reduce then spans that one rank."""
    text = " ".join(expected)
    alone = one_rank_group(ctx)
    with _recorded_warnings() as built, _call_sites(_INIT_CORE_STATE, within=_FSDP_INIT) as called_at:
        model = fsdp1_gpt(ctx, process_group=alone)
    matching = [w for w in built if str(w.message) == text]
    n_units = len(units(model))
    require(len(matching) == n_units, "no-clamp-warning", f"{len(matching)} clamp warnings for {n_units} units; got "
            f"{_messages(built)}", observed=len(matching), warnings=_messages(built))  # fmt: skip
    require_equal(sorted({w.category.__name__ for w in matching}), ["UserWarning"], reason="wrong-category",
                  what="the clamp warning's category")  # fmt: skip
    deprecations = [m for m in _messages(built) if m.startswith("FutureWarning")]
    require(not deprecations, "also-deprecation-warning", f"the clamp also warned {deprecations}",
            observed=deprecations)  # fmt: skip
    # stacklevel=2 names FullyShardedDataParallel.__init__'s own line, inside torch: the one that calls
    # `_init_core_state`, once per unit.
    torch_file = Path(inspect.getsourcefile(FSDP) or "").name
    require(all(site.startswith(f"{torch_file}:") for site in called_at), "called-elsewhere",
            f"_init_core_state was called from {called_at}, not from {torch_file}", observed=called_at)  # fmt: skip
    points_at = [_where(w.filename, w.lineno) for w in matching]
    require_equal(points_at, called_at, reason="warning-location", what="the lines the clamp warnings name")
    strategies = {
        name: (u.sharding_strategy.name, u._handle._sharding_strategy.name) for name, u in units(model).items()
    }
    require_equal(strategies, dict.fromkeys(strategies, ("NO_SHARD", "NO_SHARD")), reason="not-clamped",
                  what="(state, handle) strategy per unit")  # fmt: skip
    with record_comm() as comm:
        _, loss = model(*batch(ctx))
        loss.backward()
    spans = [(c.op, c.group_size) for c in comm]
    require_equal(spans, [("all_reduce", 1)] * n_units, reason="not-one-rank-all-reduces", what="collectives")
    return {
        "strategy": sorted(set(strategies.values())),
        "category": matching[0].category.__name__,
        "points_at": points_at,
        "group_sizes": [c.group_size for c in comm],
    }


def hybrid_shard_of_one_never_syncs(ctx: RankContext) -> dict[str, Any]:
    """HYBRID_SHARD with a one-rank shard group and all ranks as replicas: clamped to NO_SHARD, it all-reduces over
    the one-rank group only, so each rank keeps its own local gradient, divided as if the ranks had been summed."""
    alone = one_rank_group(ctx)
    with _recorded_warnings():
        model = fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy.HYBRID_SHARD, process_group=(alone, dist.group.WORLD))
    strategies = sorted({u._handle._sharding_strategy.name for u in units(model).values()})
    require_equal(strategies, ["NO_SHARD"], reason="not-clamped", what="handle strategies")
    x, y = batch(ctx)
    with record_comm() as comm:
        _, loss = model(x, y)
        loss.backward()
    replica = _replica(ctx)
    _, ref = replica(x, y)
    ref.backward()
    ours = {clean(name): p for name, p in model.named_parameters()}
    ratios: set[float] = set()
    for name, param in replica.named_parameters():
        ratios.update(_ratios(ours[name].grad.cpu(), param.grad.cpu()))
    # The factors are computed for all the data-parallel ranks (shard group × replicas); the all-reduce over one
    # rank changes nothing in between. A factor of 1 is skipped, which divides by 1 all the same.
    expected = 1 / (predivide(ctx.world_size) * postdivide(ctx.world_size))
    require_equal(sorted(ratios), [expected], reason="not-own-gradient-divided", what="gradient / local gradient")
    spans = sorted({(c.op, c.group_size) for c in comm})
    require_equal(spans, [("all_reduce", 1)], reason="not-one-rank-all-reduces", what="(collective, group size)")
    checksums = ctx.gather(float(sum(p.grad.double().sum() for p in ours.values())))
    require(len(set(checksums)) == ctx.world_size, "replicas-in-sync", f"gradient checksums per rank: {checksums}",
            observed=checksums)  # fmt: skip
    return {"strategy": strategies[0], "group_sizes": [c.group_size for c in comm], "grad_over_local": ratios.pop()}


# -- break-it recipes: this guide's behaviour bent on purpose (tests/break_it/ applies them) --------------
def map_no_shard_to(original: dict[Any, Any], strategy: str = "FULL_SHARD") -> dict[Any, Any]:
    """``SHARDING_STRATEGY_MAP`` with NO_SHARD pointing at a sharded handle strategy."""
    from torch.distributed.fsdp._flat_param import HandleShardingStrategy

    return {**original, ShardingStrategy.NO_SHARD: HandleShardingStrategy[strategy]}


@contextlib.contextmanager
def _all_reduce_replaced(replacement: Any) -> Iterator[Any]:
    """``dist.all_reduce`` is ``replacement(original, ...)`` for the duration (only around one FSDP call)."""
    original = dist.all_reduce
    dist.all_reduce = lambda *args, **kwargs: replacement(original, *args, **kwargs)
    try:
        yield
    finally:
        dist.all_reduce = original


def reduce_without_all_reduce(original: Any, state: Any, handle: Any) -> None:
    """`_reduce_grad_no_shard` whose all-reduce does nothing: the divides still run."""
    with _all_reduce_replaced(lambda _all_reduce, *args, **kwargs: None):
        original(state, handle)


def reduce_with_all_reduce_twice(original: Any, state: Any, handle: Any) -> None:
    """`_reduce_grad_no_shard` that all-reduces the same gradient twice."""

    def twice(all_reduce: Any, *args: Any, **kwargs: Any) -> Any:
        all_reduce(*args, **kwargs)
        return all_reduce(*args, **kwargs)

    with _all_reduce_replaced(twice):
        original(state, handle)


def init_core_state_silently(original: Any, *args: Any) -> Any:
    """`_init_core_state` with every warning it emits swallowed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return original(*args)


def init_core_state_with_user_warnings(original: Any, *args: Any) -> Any:
    """`_init_core_state` whose warnings come out as plain UserWarnings, same text, same caller."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = original(*args)
    for w in caught:
        warnings.warn_explicit(str(w.message), UserWarning, w.filename, w.lineno)
    return state


def init_core_state_naming_the_def_line(original: Any, *args: Any) -> Any:
    """`_init_core_state` whose warnings name the first line (the ``def``) of the function they should point
    into, in the same file, instead of the line that called: the clamp's ``FullyShardedDataParallel.__init__``
    (stacklevel 2), the deprecation's caller of it (stacklevel 3)."""
    import sys

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = original(*args)
    init = sys._getframe()
    while init is not None and code_of(init) is not codeswap.original(inspect.unwrap(FSDP.__init__).__code__):
        init = init.f_back
    for w in caught:
        named = init.f_back if issubclass(w.category, FutureWarning) else init
        code = named.f_code
        warnings.warn_explicit(str(w.message), w.category, code.co_filename, code.co_firstlineno)
    return state


def init_core_state_without_clamp(original: Any, state: Any, *args: Any) -> Any:
    """`_init_core_state` that does not see a one-rank group as one rank, so it keeps the requested strategy."""
    real = state.world_size
    state.world_size = max(real, 2)
    try:
        return original(state, *args)
    finally:
        state.world_size = real


def reduce_also_over_replicas(original: Any, state: Any, handle: Any) -> None:
    """`_reduce_grad_no_shard` followed by the all-reduce over the replicate group that a clamped HYBRID_SHARD
    never issues: what a fix for pytorch#154888 would add."""
    original(state, handle)
    replicas = getattr(state, "_inter_node_pg", None)
    if replicas is not None:
        dist.all_reduce(handle.flat_param.grad, group=replicas)


def divide_for_the_shard_group_only(original: Any, state: Any, *args: Any, **kwargs: Any) -> Any:
    """`_init_process_group_state` that sizes the divide factors by the shard group alone, leaving out the
    replicas, as the clamp sizes the strategy."""
    state = original(state, *args, **kwargs)
    state._gradient_predivide_factor = predivide(state.world_size)
    state._gradient_postdivide_factor = postdivide(state.world_size)
    return state


def flatten_as_if_alone(original: Any, handle: Any, *args: Any, **kwargs: Any) -> Any:
    """`FlatParamHandle._init_flat_param_and_metadata` that builds a NO_SHARD flat parameter as if its group had
    one rank, so nothing pads it for the world size: what guide 09 once said torch does."""
    from torch.distributed.fsdp._flat_param import HandleShardingStrategy

    real = handle.world_size
    if handle._sharding_strategy == HandleShardingStrategy.NO_SHARD:
        handle.world_size = 1
    try:
        return original(handle, *args, **kwargs)
    finally:
        handle.world_size = real
