"""Checks for guide 10, `no_sync` and frozen units: what backward keeps, frees and reduces when gradients are not
synchronised, and when a unit whose parameters need no gradient is resharded.

Expected values never come from FSDP: sizes from the flat-parameter model (`checks.models.flat_param`), hook
orders from the backward rule model (`checks.models.prefetch`) or the guide's `expect` blocks, and the gradients of
an accumulated batch from an unwrapped replica of the model run in this process on the whole batch.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp import _runtime_utils as ru

from checks.models.flat_param import FlatParamSpec, Param, flat_param
from checks.models.prefetch import backward_sequence
from checks.naming import ROOT, clean
from checks.probes import CommLog, EventLog, FsdpEvent, assert_sequence, capture, record_comm, record_events
from checks.probes.by_unit import collectives_by_unit
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads import toy
from checks.workloads.gpt import (
    POST_FORWARD,
    batch,
    ddp_gpt,
    ddp_grads,
    flat_grad_shards,
    fsdp1_gpt,
    grad_shards,
    padded_sizes,
    unit_numels,
    unit_of_parameter,
    unit_parameters,
    units,
)
from mini_gpt import GPT, BatchSampler, corpus_tokens, preset
from mini_gpt.train import make_optimizer

# The events a backward's timing is read from; unshards and prefetches are guide 06's.
BACKWARD_KINDS = ("pre_backward", "post_backward", "free", "reshard", "reduce_grad", "final_callback")
MICRO_BATCHES = 2


def _held_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes held by each unit's padded unsharded flat parameter (0 once FSDP freed its storage)."""
    return {
        name: unit._handle.flat_param._full_param_padded.untyped_storage().nbytes()
        for name, unit in units(model).items()
    }


def _describe(event: FsdpEvent) -> str:
    return event.describe() + (f" ({event.detail})" if event.kind == "post_backward" and event.detail else "")


def _backward_order(events: EventLog) -> list[str]:
    """The backward's hooks, reshards, reductions and final callback, in order (``post_backward U (reshard only)``
    for the reshard-only hook)."""
    return [_describe(e) for e in events if e.kind in BACKWARD_KINDS and e.state != "FORWARD"]


def _expected_backward(strategy_frees: bool, reduces: bool) -> list[str]:
    """The backward of the four trainable units by the prefetch model (BACKWARD_PRE, the default), with what each
    post-backward does right after its hook: free or keep the parameters, then reduce (or not)."""
    expected = []
    for line in backward_sequence(POST_FORWARD, "BACKWARD_PRE"):
        if line.startswith("prefetch"):
            continue
        expected.append(line)
        if line.startswith("post_backward"):
            unit = line.split()[1]
            expected.append(f"{'free' if strategy_frees else 'reshard'} {unit}")
            if reduces:
                expected.append(f"reduce_grad {unit}")
    return [*expected, f"final_callback {ROOT}"]


@contextmanager
def _sources() -> Iterator[None]:
    """Make the event recorder attribute torch source lines (`checks.probes.capture`) inside the block, and hand
    what it recorded on to an outer capture (``fsdp-readings timeline``) if there is one."""
    if capture.active():
        yield
        return
    with capture.collecting():
        yield


def _function_at(source: str) -> str:
    """The `_runtime_utils` function whose body holds the line ``source`` (``…/_runtime_utils.py:799``)."""
    if not source.startswith("torch/distributed/fsdp/_runtime_utils.py:"):
        return source or "?"
    line = int(source.rsplit(":", 1)[1])
    for name in ("_post_backward_reshard", "_catch_all_reshard", "_post_forward_reshard"):
        lines, first = inspect.getsourcelines(getattr(ru, name))
        if first <= line < first + len(lines):
            return name
    return source


def _step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[CommLog, EventLog]:
    """One forward and backward, with every collective and FSDP event recorded."""
    with record_comm() as comm, record_events(model) as events:
        model(x, y)[1].backward()
    return comm, events


# -- 1. FULL_SHARD inside no_sync --------------------------------------------------------------------------------
def _original_grad_shapes(model: nn.Module) -> dict[str, list[int] | None]:
    return {clean(n): None if p.grad is None else list(p.grad.shape) for n, p in model.named_parameters()}


def _model_shapes() -> dict[str, list[int]]:
    """Each original parameter's shape, from the model built on the meta device (no FSDP involved)."""
    with torch.device("meta"):
        model = GPT(preset("tiny"))
    return {name: list(p.shape) for name, p in model.named_parameters()}


_QKV = "blocks.0.attn.qkv.weight"


def _gpt_flat_params(world_size: int) -> dict[str, FlatParamSpec]:
    """Each tiny unit's flat parameter by the spec (``use_orig_params=True``, fp32), from the model's own sizes."""
    return {
        unit: flat_param([Param(name, (numel,)) for name, numel in params], world_size, use_orig_params=True)
        for unit, params in unit_parameters().items()
    }


def no_sync_keeps_unsharded_grad(ctx: RankContext) -> dict[str, Any]:
    """After a backward inside ``no_sync`` every unit's flat parameter is back to its shard, but its ``.grad`` is
    the whole unsharded gradient of this rank's batch: the flat parameter's length as built (the spec's
    ``flat_numel``, torch's ``_unpadded_unsharded_size``), not the shard; no reduced shard is saved; and every
    original parameter's ``.grad`` is a view of its full shape."""
    model = fsdp1_gpt(ctx)
    with model.no_sync():
        model(*batch(ctx))[1].backward()
    flats = _gpt_flat_params(ctx.world_size)
    handles = {name: unit._handle for name, unit in units(model).items()}
    observed = {
        "grad": {n: h.flat_param.grad.numel() if h.flat_param.grad is not None else None for n, h in handles.items()},
        "param": {n: h.flat_param.numel() for n, h in handles.items()},
        "saved_shard": sorted(n for n, h in handles.items() if hasattr(h.flat_param, "_saved_grad_shard")),
    }
    expected = {
        "grad": {n: flats[n].flat_numel for n in handles},
        "param": {n: flats[n].shard_numel for n in handles},
        "saved_shard": [],
    }
    for key, reason in (("grad", "grad-size"), ("param", "param-size"), ("saved_shard", "saved-shard")):
        require_equal(observed[key], expected[key], reason=reason, what=f"rank {ctx.rank} after no_sync: {key}")
    views = _original_grad_shapes(model)
    require_equal(views, _model_shapes(), reason="grad-views", what="original parameters' .grad shapes")
    # The parameters themselves are back to 1-D views of the shard (guide 03): gradient and parameter differ.
    ranks = sorted({p.dim() for p in model.parameters()})
    require_equal(ranks, [1], reason="params-not-sharded", what="dimensions of the original parameters")
    qkv = {clean(n): p for n, p in model.named_parameters()}[_QKV]
    observed["qkv"] = {"param": list(qkv.shape), "grad": list(qkv.grad.shape)}
    return observed


def _toy_flat_params(world_size: int, use_orig_params: bool) -> dict[str, FlatParamSpec]:
    """The toy's three units by the spec: children ``0`` and ``1``, and the root holding layer ``2``."""
    return {
        unit: flat_param([Param("weight", (o, i)), Param("bias", (o,))], world_size, use_orig_params=use_orig_params)
        for unit, (i, o) in zip(("0", "1", ROOT), toy.TOY_LAYERS, strict=True)
    }


def no_sync_grad_is_flat_param_as_built(ctx: RankContext, use_orig_params: bool, backwards: int = 2) -> dict[str, Any]:
    """The gradient kept inside ``no_sync`` has the length of the flat parameter as built, after every no_sync
    backward: on four ranks the toy's root holds 30 elements, which ``use_orig_params=False`` pads to 32 only when
    sharding (the gradient has 30), and ``use_orig_params=True`` aligns and pads inside the flat parameter (the
    gradient has the spec's 36). Never a shard."""
    model = toy.wrap_fsdp1(toy.toy_model(ctx.device), ctx, use_orig_params=use_orig_params)
    named = {"0": getattr(model, "0"), "1": getattr(model, "1"), ROOT: model}  # the root keeps layer 2
    flats = _toy_flat_params(ctx.world_size, use_orig_params)
    seen: dict[str, list[int | None]] = {u: [] for u in named}
    with model.no_sync():
        for step in range(backwards):
            model(toy.toy_batch(ctx, step=step)).sum().backward()
            for u, m in named.items():
                grad = m._handle.flat_param.grad
                seen[u].append(None if grad is None else grad.numel())  # type: ignore[arg-type]
    expected = {u: [flats[u].flat_numel] * backwards for u in named}
    require_equal(seen, expected, reason="grad-size", what=f"rank {ctx.rank}: no_sync gradient lengths per backward")
    return {
        "grad": seen,
        "padded": {u: f.padded_unsharded_numel for u, f in flats.items()},
        "shard": {u: f.shard_numel for u, f in flats.items()},
    }


def full_shard_no_sync_frees_params(ctx: RankContext) -> dict[str, Any]:
    """Under FULL_SHARD inside ``no_sync`` every unit's post-backward frees its unsharded parameters at once (in
    the model's post-backward order) and reduces nothing; after backward no unit holds unsharded storage."""
    model = fsdp1_gpt(ctx)
    with model.no_sync():
        _, events = _step(model, *batch(ctx))
    observed = _backward_order(events)
    expected = _expected_backward(strategy_frees=True, reduces=False)
    assert_sequence(observed, expected, what="no_sync backward under FULL_SHARD", reason="no-sync-backward")
    held = _held_bytes(model)
    require_equal(held, dict.fromkeys(held, 0), reason="held-after-backward", what="unsharded bytes after backward")
    return {"order": observed, "held": held}


def no_sync_reduces_nothing(ctx: RankContext) -> dict[str, Any]:
    """A FULL_SHARD step inside ``no_sync`` all-gathers exactly as a synced one (every unit in forward, every unit
    but the root again in backward, in the order the units run) and issues no reduce-scatter and no all-reduce;
    the synced step after it adds one reduce-scatter per unit, in post-backward order. Each collective is named
    by its unit (`collectives_by_unit`): the three blocks have one size, so sizes alone would not show the order."""
    model = fsdp1_gpt(ctx)
    sizes = padded_sizes(ctx.world_size, element_bytes=4)
    backward_units = [u for u in reversed(POST_FORWARD) if u != ROOT]  # the root was kept after forward (03)
    post_order = [line.split()[1] for line in backward_sequence(POST_FORWARD, None) if line.startswith("post")]
    gathers = {"forward": list(sizes), "backward": backward_units}
    observed: dict[str, dict[str, Any]] = {}
    for label, step in (("no_sync", 0), ("sync", 1)):
        if label == "no_sync":
            with model.no_sync():
                comm, events = _step(model, *batch(ctx, step=step))
        else:
            comm, events = _step(model, *batch(ctx, step=step))
        seen = {
            "forward_all_gather": collectives_by_unit(comm, events, "all_gather", in_backward=False),
            "backward_all_gather": collectives_by_unit(comm, events, "all_gather", in_backward=True),
            "reduce_scatter": collectives_by_unit(comm, events, "reduce_scatter"),
            "all_reduce": [c.numel for c in comm.select("all_reduce")],
        }
        want = {
            "forward_all_gather": [f"{u} {sizes[u]}" for u in gathers["forward"]],
            "backward_all_gather": [f"{u} {sizes[u]}" for u in gathers["backward"]],
            "reduce_scatter": [] if label == "no_sync" else [f"{u} {sizes[u]}" for u in post_order],
            "all_reduce": [],
        }
        for key, sizes_seen in seen.items():
            reason = f"{label}-{key}".replace("_", "-")  # e.g. no-sync-reduce-scatter
            assert_sequence(sizes_seen, want[key], what=f"{label} step: {key} sizes", reason=reason)
        observed[label] = {key: len(value) for key, value in seen.items()}
    return observed


def _reference_grads(ctx: RankContext, steps: range, seed: int = 0) -> dict[str, torch.Tensor]:
    """The gradient of the mean loss over every row of every micro-batch's global batch, from one unwrapped model
    in this process: no FSDP, no collective."""
    sampler = BatchSampler(corpus_tokens(), preset("tiny").block_size, 8)
    xs, ys = zip(*(sampler.global_batch(step) for step in steps), strict=True)
    model = GPT(preset("tiny"), seed=seed).to(ctx.device)
    model(torch.cat(xs).to(ctx.device), torch.cat(ys).to(ctx.device))[1].backward()
    return {name: p.grad for name, p in model.named_parameters()}


def accumulated_grad_is_whole_batch(ctx: RankContext, rtol: float = 1e-5) -> dict[str, Any]:
    """Micro-batch 0 inside ``no_sync``, micro-batch 1 outside, each loss scaled by 1/2: each unit's sharded
    gradient is this rank's slice of the gradient of the mean loss over both global batches (16 rows), computed by
    an unwrapped model in one backward, within ``rtol`` of the unit's largest gradient."""
    model = fsdp1_gpt(ctx)
    for step in range(MICRO_BATCHES):
        x, y = batch(ctx, step=step)
        if step < MICRO_BATCHES - 1:
            with model.no_sync():
                model(x, y)[1].div(MICRO_BATCHES).backward()
        else:
            model(x, y)[1].div(MICRO_BATCHES).backward()
    want = grad_shards(_reference_grads(ctx, range(MICRO_BATCHES)), ctx.world_size, ctx.rank)
    observed = {}
    for name, unit in units(model).items():
        got = unit._handle.flat_param.grad.detach().cpu()
        require_equal(list(got.shape), list(want[name].shape), reason="shard-shape", what=f"{name} shard", unit=name)
        diff, scale = (got - want[name]).abs().max().item(), want[name].abs().max().item()
        observed[name] = {"max_abs_diff": diff, "max_abs_grad": scale, "relative": diff / scale}
        message = f"rank {ctx.rank} {name}: max |FSDP − reference| {diff:.3g} exceeds {rtol:g} × {scale:.3g}"
        require(diff <= rtol * scale, "beyond-tolerance", message, unit=name, bound=rtol * scale, **observed[name])
    return {"units": observed, "worst": max(d["relative"] for d in observed.values())}


# -- 2. SHARD_GRAD_OP inside no_sync -----------------------------------------------------------------------------
def shard_grad_op_no_sync_keeps_params(ctx: RankContext) -> dict[str, Any]:
    """Under SHARD_GRAD_OP inside ``no_sync`` each post-backward reshards without freeing and the final callback's
    catch-all finds nothing to do, so every unit still holds its unsharded storage after backward; the next,
    synced, step then all-gathers nothing, forward or backward, reduces once per unit and frees everything."""
    model = fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy.SHARD_GRAD_OP)
    full = {name: 4 * numel for name, numel in padded_sizes(ctx.world_size, element_bytes=4).items()}
    with model.no_sync():
        _, events = _step(model, *batch(ctx, step=0))
    order = _backward_order(events)
    expected = _expected_backward(strategy_frees=False, reduces=False)
    assert_sequence(order, expected, what="no_sync backward under SHARD_GRAD_OP", reason="no-sync-backward")
    held = _held_bytes(model)
    require_equal(held, full, reason="held-after-backward", what="unsharded bytes after the no_sync backward")
    comm, events = _step(model, *batch(ctx, step=1))
    gathers = comm.count("all_gather")
    require_equal(gathers, 0, reason="synced-step-all-gathers", what="all-gathers of the synced step after no_sync")
    unshards = sorted({e.detail for e in events.select("unshard")})
    require_equal(unshards, ["no all-gather"], reason="synced-step-all-gathers", what="the synced step's unshards")
    reduce_scatters = comm.count("reduce_scatter")
    require_equal(reduce_scatters, len(full), reason="synced-step-reductions", what="reduce-scatters of that step")
    after = _held_bytes(model)
    require_equal(after, dict.fromkeys(after, 0), reason="held-after-synced-step", what="bytes after the synced step")
    return {"order": order, "held": held, "synced_all_gathers": gathers, "synced_reduce_scatters": reduce_scatters}


# -- 2b. a run of micro-batches: what each step communicates --------------------------------------------------------
SHORT = {"full-shard": "FULL_SHARD", "shard-grad-op": "SHARD_GRAD_OP", "ddp": "DDP"}


def _strategy_model(ctx: RankContext, strategy: str) -> nn.Module:
    if strategy == "ddp":
        return ddp_gpt(ctx)
    return fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy[SHORT[strategy]])


def _step_collectives(model: nn.Module, strategy: str, x: torch.Tensor, y: torch.Tensor) -> dict[str, list[str]]:
    """One forward and backward's collectives by kind: ``unit elements`` per all-gather (forward, backward) and
    reduce-scatter, and the elements of each all-reduce."""
    if strategy == "ddp":
        with record_comm() as comm:
            model(x, y)[1].backward()
        return {
            "forward": [],
            "backward": [],
            "reduce": [],
            "all_reduce": [str(c.numel) for c in comm.select("all_reduce")],
        }
    comm, events = _step(model, x, y)
    return {
        "forward": collectives_by_unit(comm, events, "all_gather", in_backward=False),
        "backward": collectives_by_unit(comm, events, "all_gather", in_backward=True),
        "reduce": collectives_by_unit(comm, events, "reduce_scatter"),
        "all_reduce": [str(c.numel) for c in comm.select("all_reduce")],
    }


def no_sync_steps(ctx: RankContext, strategies: list[str], syncs: list[bool], expected: list[str]) -> dict[str, Any]:
    """A run of steps, step i inside ``no_sync()`` unless ``syncs[i]``, the optimizer stepping after each synced
    one: every step's collectives (unit and elements of each all-gather and reduce-scatter, elements all-reduced)
    are `checks.models.comm_volume.accumulation_steps`' for the strategy, as multisets per kind (guide 06 and the
    claims above hold their order); the guide's lines (``expected``) count them."""
    from contextlib import nullcontext

    from checks.models.comm_volume import accumulation_steps

    shapes = {unit: [(n,) for n in numels] for unit, numels in unit_numels().items()}
    lines = []
    observed: dict[str, list[dict[str, int]]] = {}
    for strategy in strategies:
        model = _strategy_model(ctx, strategy)
        optim = make_optimizer(model, 1e-3)
        model_steps = accumulation_steps(strategy, shapes, ctx.world_size, syncs, root=ROOT)
        for i, (sync, volume) in enumerate(zip(syncs, model_steps, strict=True)):
            with nullcontext() if sync else model.no_sync():
                seen = _step_collectives(model, strategy, *batch(ctx, step=i))
            if sync:
                optim.step()
                optim.zero_grad(set_to_none=True)
            want = {
                "forward": [f"{o.unit} {o.numel}" for o in volume.ops if o.op == "all_gather" and not o.backward],
                "backward": [f"{o.unit} {o.numel}" for o in volume.ops if o.op == "all_gather" and o.backward],
                "reduce": [f"{o.unit} {o.numel}" for o in volume.ops if o.op == "reduce_scatter"],
                "all_reduce": [str(o.numel) for o in volume.ops if o.op == "all_reduce"],
            }
            label = "sync" if sync else "no_sync"
            for kind, wanted in want.items():
                require_equal(sorted(seen[kind]), sorted(wanted), reason=f"{kind.replace('_', '-')}-differs-from-model",
                              what=f"{strategy} step {i + 1} ({label}): {kind} collectives", strategy=strategy,
                              step=i + 1)  # fmt: skip
            counts = {kind: len(v) for kind, v in seen.items()}
            observed.setdefault(strategy, []).append(counts)
            reduced = sum(int(n) for n in seen["all_reduce"])
            lines.append(
                f"{strategy} {i + 1} {label}: AG {counts['forward']}+{counts['backward']}, RS {counts['reduce']}, "
                f"AR {reduced:,}"
            )
        del model, optim
    require_equal(lines, expected, reason="steps-differ-from-guide", what="each step's collectives, counted")
    return {"steps": observed, "lines": lines}


# -- 3. frozen units -----------------------------------------------------------------------------------------------
def _gpt_with_frozen_unit(ctx: RankContext, frozen: str, strategy: str = "FULL_SHARD") -> FSDP:
    """mini_gpt wrapped as in `checks.workloads.gpt.fsdp1_gpt`, with every parameter of unit ``frozen`` set not to
    require grad before wrapping, so its flat parameter does not require grad either."""
    model = GPT(preset("tiny"), seed=0).to(ctx.device)
    names = {ROOT, *(f"blocks.{i}" for i in range(len(model.blocks)))}
    for name, param in model.named_parameters():
        if unit_of_parameter(name, names) == frozen:
            param.requires_grad_(False)
    options = {"device_id": ctx.device, "use_orig_params": True, "sharding_strategy": ShardingStrategy[strategy]}
    for i, block in enumerate(model.blocks):
        model.blocks[i] = FSDP(block, **options)
    return FSDP(model, **options)


def frozen_unit_reshards(ctx: RankContext, frozen: str, expected: list[str]) -> dict[str, Any]:
    """One FULL_SHARD step with unit ``frozen`` frozen: the backward's hooks, frees, reductions and final callback
    come in the ``expected`` order (the guide's expect block), the frozen unit gets no gradient, and its free is
    issued from the function the order implies: `_post_backward_reshard` when the reshard-only hook ran for it,
    `_catch_all_reshard` when the free comes after the final callback."""
    model = _gpt_with_frozen_unit(ctx, frozen)
    with _sources():
        comm, events = _step(model, *batch(ctx))
    order = _backward_order(events)
    assert_sequence(order, expected, what=f"backward with {frozen} frozen", reason="frozen-timing")
    frees = [e for e in events if e.kind == "free" and e.unit == frozen and e.state != "FORWARD"]
    issued_by = [_function_at(e.source) for e in frees]
    late = order.index(f"free {frozen}") > order.index(f"final_callback {ROOT}")
    want = ["_catch_all_reshard" if late else "_post_backward_reshard"]
    require_equal(issued_by, want, reason="frozen-free-source", what=f"function that freed {frozen} in backward")
    grad = units(model)[frozen]._handle.flat_param.grad
    require(grad is None, "frozen-has-grad", f"the frozen {frozen} has a gradient of {grad.numel() if grad else 0}")
    reduced = sorted(e.unit for e in events.select("reduce_grad"))
    require_equal(reduced, sorted(set(units(model)) - {frozen}), reason="frozen-reduced", what="units reduced")
    held = _held_bytes(model)
    require_equal(held, dict.fromkeys(held, 0), reason="held-after-backward", what="unsharded bytes after backward")
    return {"order": order, "freed_by": issued_by[0], "reduce_scatters": comm.count("reduce_scatter")}


# -- 4. a frozen parameter inside a trainable unit ------------------------------------------------------------------
def _gpt_with_frozen_parameter(ctx: RankContext, frozen: str) -> FSDP:
    """mini_gpt wrapped as `fsdp1_gpt` does (``use_orig_params=True``), with the one parameter ``frozen`` set not to
    require grad before wrapping: its unit's flat parameter still requires grad, for the others."""
    model = GPT(preset("tiny"), seed=0).to(ctx.device)
    dict(model.named_parameters())[frozen].requires_grad_(False)
    options = {"device_id": ctx.device, "use_orig_params": True}
    for i, block in enumerate(model.blocks):
        model.blocks[i] = FSDP(block, **options)
    return FSDP(model, **options)


def _split_in_torch(model: FSDP, unit: str, frozen: str) -> int:
    """How many of ``frozen``'s elements this rank's shard holds, by torch's own ``_shard_param_infos``."""
    flat_param = units(model)[unit]._handle.flat_param
    found = [
        info.numel_in_shard if info.in_shard else 0
        for fqn, info in zip(flat_param._fqns, flat_param._shard_param_infos, strict=True)
        if frozen == (clean(fqn) if unit == ROOT else f"{unit}.{clean(fqn)}")
    ]
    require_equal(len(found), 1, reason="frozen-not-found", what=f"{frozen} in {unit}'s flat parameter")
    return found[0]


def frozen_parameter_gets_no_grad(
    ctx: RankContext, frozen: str, shard_elements: list[int], steps: int = 2
) -> dict[str, Any]:
    """With ``use_orig_params=True`` a frozen parameter that shares a flat parameter with trainable ones never
    gets a ``.grad``, on any rank, after any backward, and AdamW never sees one: after ``steps`` steps it holds no
    state for it and the parameter is bit for bit what it was, while every trainable parameter of its unit moved.
    Its elements of the unit's flat gradient are computed and reduced all the same: the sharded flat gradient after
    the first backward is, bit for bit (N=2), this rank's slice of DDP's gradient of the same model with nothing
    frozen, the frozen parameter's piece included (the flat-parameter model places it)."""
    model = _gpt_with_frozen_parameter(ctx, frozen)
    unit = unit_of_parameter(frozen, set(units(model)))
    # ``shard_elements``: the guide's split of the frozen parameter over the ranks' shards, which the flat-parameter
    # model gives and torch's own shard metadata must hold on every rank.
    spec = _gpt_flat_params(ctx.world_size)[unit]
    index = [clean(f) for f in spec.fqns].index(frozen)
    modelled = [(infos[index].numel_in_shard if infos[index].in_shard else 0)
                for infos in (spec.shard_param_infos(r) for r in range(ctx.world_size))]  # fmt: skip
    require_equal(modelled, shard_elements, reason="frozen-split-model", what=f"{frozen} per rank, by the model")
    split = ctx.gather(_split_in_torch(model, unit, frozen))
    require_equal(split, shard_elements, reason="frozen-split", what=f"{frozen} per rank, by torch's shard metadata")
    originals = {clean(n): p for n, p in model.named_parameters()}
    with FSDP.summon_full_params(model, writeback=False):
        before = {n: p.detach().clone() for n, p in originals.items()}
    optim = make_optimizer(model, 1e-3)
    grads_seen: list[str] = []
    for step in range(steps):
        optim.zero_grad(set_to_none=True)
        model(*batch(ctx, step=step))[1].backward()
        if originals[frozen].grad is not None:
            grads_seen.append(f"after backward {step + 1}")
        if step == 0:
            shards = flat_grad_shards(model)
        optim.step()
        if originals[frozen].grad is not None:
            grads_seen.append(f"after step {step + 1}")
    require_equal(grads_seen, [], reason="frozen-has-grad", what=f"rank {ctx.rank}: when {frozen} had a .grad")
    stateful = sorted(n for n, p in originals.items() if optim.state.get(p))
    require(frozen not in stateful, "optimizer-saw-frozen", f"AdamW keeps state for {frozen}", observed=stateful)
    with FSDP.summon_full_params(model, writeback=False):
        moved = sorted(n for n, p in originals.items() if not torch.equal(p, before[n]))
    require_equal(moved, sorted(set(before) - {frozen}), reason="frozen-moved", what="parameters the steps changed")
    ddp = ddp_gpt(ctx)
    ddp(*batch(ctx, step=0))[1].backward()
    want = grad_shards(ddp_grads(ddp), ctx.world_size, ctx.rank)[unit]
    require(torch.equal(shards[unit], want), "flat-grad-differs", f"rank {ctx.rank}: {unit}'s sharded flat gradient "
            "is not DDP's slice with nothing frozen")  # fmt: skip
    info = dict(zip([clean(f) for f in spec.fqns], spec.shard_param_infos(ctx.rank), strict=True))[frozen]
    piece = shards[unit][info.offset_in_shard : info.offset_in_shard + info.numel_in_shard] if info.in_shard else None
    return {
        "unit": unit,
        "frozen_elements_here": info.numel_in_shard if info.in_shard else 0,
        "split": split,
        "frozen_piece_nonzero": int(piece.ne(0).sum()) if piece is not None else 0,
        "moved": len(moved),
        "stateful": len(stateful),
    }


# -- break-it recipes: this guide's behaviour bent on purpose (tests/break_it/ applies them) --------------
def reduce_anyway(original: Any, state: Any, handle: Any, *args: Any) -> Any:
    """``_post_backward_hook`` that synchronises even inside ``no_sync`` (as if the flag were never cleared)."""
    sync = state._sync_gradients
    state._sync_gradients = True
    try:
        return original(state, handle, *args)
    finally:
        state._sync_gradients = sync


def forget_unsharded_grad(original: Any, handle: Any) -> None:
    """``FlatParamHandle.prepare_gradient_for_backward`` that drops a gradient kept from a no_sync backward."""
    flat_param = handle.flat_param
    if flat_param.grad is not None and flat_param.grad.size() == flat_param._unpadded_unsharded_size:
        flat_param.grad = None
    original(handle)


def hold_reshard_only(original: Any, state: Any, handle: Any, *args: Any) -> None:
    """``_post_backward_reshard_only_hook`` that does nothing: the frozen unit is left to the catch-all."""


def catch_all_freeing_silently(original: Any, state: Any) -> None:
    """``_catch_all_reshard`` that also frees any unsharded storage still allocated, without going through
    ``_reshard`` (so no event records it): only the bytes held show it."""
    original(state)
    handle = state._handle
    if handle and handle.uses_sharded_strategy and not handle.needs_unshard():
        handle._free_unsharded_flat_param()


def frozen_gets_grad_views(original: Any, handle: Any) -> None:
    """``FlatParamHandle._use_sharded_grad_views`` that gives frozen parameters a view of their gradient too."""
    original(handle)
    flat, grad = handle.flat_param, handle.sharded_grad
    if grad is None:
        return
    for param, info in zip(flat._params, flat._shard_param_infos, strict=True):
        if info.in_shard and not param.requires_grad:
            param.grad = grad[info.offset_in_shard : info.offset_in_shard + info.numel_in_shard].reshape(param.shape)


def zero_frozen_gradients(original: Any, state: Any, handle: Any) -> None:
    """``_reduce_grad`` that zeroes the frozen parameters' elements of the unsharded flat gradient first, as if FSDP
    skipped a gradient nobody reads."""
    flat, offset, index = handle.flat_param, 0, 0
    for numel, is_padding in zip(flat._numels_with_padding, flat._is_padding_mask, strict=True):
        if not is_padding:
            if not flat._params[index].requires_grad:
                flat.grad[offset : offset + numel].zero_()
            index += 1
        offset += numel
    original(state, handle)


def ddp_no_sync_syncs_anyway(original: Any, self: Any) -> Any:
    """`DistributedDataParallel.no_sync` that leaves ``require_backward_grad_sync`` alone: every step all-reduces."""
    from contextlib import nullcontext

    return nullcontext()
