"""Checks for guide 11, the final callback and HYBRID_SHARD: what the end of backward resets and reshards, and
how HYBRID_SHARD reduces over two groups (or, with one-rank shard groups, fails to).

Expected values never come from the state being checked: the reset values are the guide's expect block (the
values the source assigns), orders come from the model's structure (guide 06's post-forward order), shard sizes
from the flat-parameter layout model, and reference gradients and parameters from DDP on the same per-rank
batches, laid out by `checks.workloads.gpt.grad_shards`.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from checks.models.flat_param import layout
from checks.naming import ROOT
from checks.numerics import pairwise_sums
from checks.probes import assert_sequence, record_comm, record_events
from checks.ranks import tracing
from checks.ranks.context import RankContext
from checks.ranks.symbols import code_objects
from checks.violation import require, require_equal
from checks.workloads.gpt import (
    POST_FORWARD,
    batch,
    ddp_gpt,
    fsdp1_gpt,
    grad_shards,
    post_backward_order,
    unit_numels,
    units,
)
from checks.workloads.groups import one_rank_group
from mini_gpt import GPT, preset
from mini_gpt.model import Block
from mini_gpt.train import make_optimizer

RU = "torch.distributed.fsdp._runtime_utils"
FINAL_CALLBACK = f"{RU}:_post_backward_final_callback"
CATCH_ALL = f"{RU}:_catch_all_reshard"
FINALIZE = f"{RU}:_finalize_params"
# The order the units' pre-forwards run in, so the order iteration 1 records: the root's forward starts first.
PRE_FORWARD = (ROOT, "blocks.0", "blocks.1", "blocks.2")
LR = 1e-3


def _code(symbol: str) -> types.CodeType:
    [code] = code_objects(symbol)
    return code


@contextmanager
def _observing(hooks: dict[str, tracing.CallHook]) -> Iterator[None]:
    """Observe torch functions by symbol (their code runs unchanged); a hook that failed fails the check."""
    with tracing.subscribed({_code(symbol): hook for symbol, hook in hooks.items()}) as subscription:
        yield
    if subscription.errors:
        raise RuntimeError(f"the observer failed: {subscription.errors[0]!r}")


def _names(model: nn.Module) -> dict[int, str]:
    return {id(unit): name for name, unit in units(model).items()}


# -- claim: every state IDLE after backward ----------------------------------------------------------------------
HANDLE_FIELDS = ("_training_state", "_ran_pre_backward_hook", "_needs_pre_backward_unshard", "_post_forward_index",
                 "_prefetched")  # fmt: skip


def _text(value: Any) -> str:
    """A value as the guide's expect block writes it: an enum member by name, anything else by repr."""
    return value.name if hasattr(value, "name") else repr(value)


def _unit_fields(unit: FSDP) -> dict[str, str]:
    fields = {"training_state": _text(unit.training_state)}
    fields.update({name: _text(getattr(unit._handle, name)) for name in HANDLE_FIELDS})
    return fields


def _parse_resets(lines: list[str]) -> dict[str, str]:
    resets = {}
    for line in lines:
        name, _, value = line.strip().partition(" = ")
        if not value:
            raise ValueError(f"expect line {line!r} is not '<field> = <value>'")
        resets[name] = value
    return resets


def idle_after_backward(ctx: RankContext, expected: list[str]) -> dict[str, Any]:
    """After a backward every unit's state and handle hold the values the final callback assigns (the guide's
    expect block), and the root's ``_post_backward_callback_queued`` is False. The callback, observed as it
    starts, must find the training states, ``_ran_pre_backward_hook``, ``_post_forward_index`` and the queued
    flag at other values, so it is the callback that resets them."""
    want = _parse_resets(expected)
    queued = want.pop("_post_backward_callback_queued")
    model = fsdp1_gpt(ctx)
    names = _names(model)
    before: dict[str, dict[str, str]] = {}

    def on_final(frame: types.FrameType) -> None:
        state = frame.f_locals["state"]
        before[ROOT] = {"_post_backward_callback_queued": _text(state._post_backward_callback_queued)}
        for unit in state._all_fsdp_states:
            before.setdefault(names[id(unit)], {}).update(_unit_fields(unit))

    _, loss = model(*batch(ctx))
    with _observing({FINAL_CALLBACK: on_final}):
        loss.backward()
    after = {name: _unit_fields(unit) for name, unit in units(model).items()}
    require_equal(after, dict.fromkeys(after, want), reason="not-reset", what="unit fields after backward")
    root_queued = _text(model._post_backward_callback_queued)
    require_equal(root_queued, queued, reason="callback-still-queued", what="root._post_backward_callback_queued")
    require(before, "no-final-callback", "the final callback never ran", observed=before)
    # The fields an ordinary step leaves at other values: the callback's resets are what this claim sees.
    changed = ("training_state", "_training_state", "_ran_pre_backward_hook", "_post_forward_index")
    same = {name: [f for f in changed if fields[f] == want[f]] for name, fields in before.items()}
    require(not any(same.values()), "already-reset", f"already at their reset values when the callback started: "
            f"{same}", observed=same)  # fmt: skip
    require_equal(before[ROOT]["_post_backward_callback_queued"], "True", reason="queued-not-set",
                  what="root._post_backward_callback_queued when the callback starts")  # fmt: skip
    return {"before": before, "after": after, "root_queued": root_queued}


# -- claim: the catch-all reshards a unit whose post-backward hook never ran ------------------------------------
class TwoOutputs(nn.Module):
    """A unit returning its layer's output and a parameter-free function of its input."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lin(h), h * 2.0


class CatchAllModel(nn.Module):
    """``first`` (root) → ``split`` (a unit; only its parameter-free output reaches the loss) → ``head`` (root);
    ``dropped`` (a unit) runs in forward but its output is thrown away."""

    def __init__(self, width: int = 6) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.first = nn.Linear(3, width)
            self.split = TwoOutputs(width)
            self.dropped = nn.Linear(width, width)
            self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        _, doubled = self.split(h)  # the output that depends on split's parameters is dropped
        self.dropped(h)  # a whole unit's output dropped
        return self.head(doubled)


def _catch_all_model(ctx: RankContext, **kwargs: Any) -> FSDP:
    model = CatchAllModel().to(ctx.device)
    options = {"device_id": ctx.device, "use_orig_params": True, **kwargs}
    model.split = FSDP(model.split, **options)
    model.dropped = FSDP(model.dropped, **options)
    return FSDP(model, **options)


def _reshard_observer(model: FSDP, log: list[str]) -> dict[str, tracing.CallHook]:
    """Hooks that log the final callback's start and every `_reshard` with the function that called it (event
    sources are attributed only in captured runs; this reads the caller's frame directly)."""
    names = {id(u._handle): name for name, u in units(model).items()}

    def on_final(frame: types.FrameType) -> None:
        log.append("final_callback")

    def on_reshard(frame: types.FrameType) -> None:
        kind = "free" if frame.f_locals["free_unsharded_flat_param"] else "reshard"
        caller = frame.f_back.f_code.co_name if frame.f_back is not None else "?"
        log.append(f"{kind} {names.get(id(frame.f_locals['handle']), '?')} from {caller}")

    return {FINAL_CALLBACK: on_final, f"{RU}:_reshard": on_reshard}


def _is_sharded(unit: FSDP) -> dict[str, Any]:
    flat = unit._handle.flat_param
    padded = flat._full_param_padded
    return {
        "on_local_shard": flat.data_ptr() == flat._local_shard.data_ptr(),
        "numel": flat.numel(),
        "unsharded_bytes": padded.untyped_storage().size(),
    }


def _parse_catch_all(lines: list[str]) -> dict[str, list[str]]:
    """``<backward_prefetch>: free <unit>, free <unit>`` per line, or ``<mode>: nothing``."""
    out = {}
    for line in lines:
        mode, _, frees = line.partition(":")
        out[mode.strip()] = [] if frees.strip() == "nothing" else [f.strip() for f in frees.split(",")]
    return out


def catch_all_reshards(ctx: RankContext, expected: list[str]) -> dict[str, Any]:
    """`split`'s parameter-free output reaches the loss: its pre-backward hook unshards it and no post-backward
    hook follows. `dropped`'s output never reaches the loss. For each backward-prefetch mode, the events inside
    the final callback are the frees of the guide's expect block, each issued by `_catch_all_reshard`; after
    backward every non-root unit is back on its local shard with its unsharded storage freed."""
    want = _parse_catch_all(expected)
    seen: dict[str, Any] = {}
    for mode, frees in want.items():
        prefetch = None if mode == "None" else mode
        model = _catch_all_model(ctx, backward_prefetch=BackwardPrefetch[prefetch] if prefetch else None)
        x = torch.randn(4, 3, generator=torch.Generator().manual_seed(ctx.rank))
        loss = model(x).sum()
        observed: list[str] = []
        with record_events(model) as events, _observing(_reshard_observer(model, observed)):
            loss.backward()
        timeline = [e.describe() for e in events]
        state = {name: _is_sharded(u) for name, u in units(model).items() if name != ROOT}
        for name, s in state.items():
            require(s["on_local_shard"], "unsharded-after-backward", f"{mode}: {name}'s flat parameter is not its "
                    f"local shard after backward: {s}", unit=name, mode=mode, **s)  # fmt: skip
            require_equal(s["unsharded_bytes"], 0, reason="unsharded-storage-kept", what=f"{mode}: {name}'s "
                          "unsharded storage bytes", unit=name, mode=mode)  # fmt: skip
        for kind, units_with in (("pre_backward", [ROOT, "split"]), ("post_backward", [ROOT])):
            ran = sorted({e.unit for e in events if e.kind == kind})
            require_equal(ran, sorted(units_with), reason=f"{kind.replace('_', '-')}-units", mode=mode,
                          what=f"{mode}: units with a {kind} event", events=timeline)  # fmt: skip
        require("final_callback" in observed, "no-final-callback", f"{mode}: no final callback", events=timeline)
        in_callback = observed[observed.index("final_callback") + 1 :]
        require_equal(in_callback, [f"{f} from _catch_all_reshard" for f in frees], reason="not-freed-by-catch-all",
                      what=f"{mode}: reshards inside the final callback", mode=mode, reshards=observed)  # fmt: skip
        seen[mode] = {"timeline": timeline, "reshards": observed, "in_final_callback": in_callback, "after": state}
    return seen


# -- claim: next_iter clears the post-forward order ------------------------------------------------------------
def _order(model: FSDP, handles: list[Any]) -> list[str]:
    by_handle = {id(u._handle): name for name, u in units(model).items()}
    return [by_handle[id(h)] for h in handles]


def next_iter_clears_post_forward_order(ctx: RankContext, iterations: int = 2) -> dict[str, Any]:
    """Each forward records the post-forward order (guide 06's); each backward's final callback clears it and
    counts one iteration. The pre-forward order, recorded in iteration 1 only, is kept. All units share one
    record."""
    model = fsdp1_gpt(ctx)
    seen: dict[str, Any] = {}
    for it in range(1, iterations + 1):
        _, loss = model(*batch(ctx, step=it - 1))
        eod = model._exec_order_data
        shared = {name: u._exec_order_data is eod for name, u in units(model).items()}
        require_equal(shared, dict.fromkeys(shared, True), reason="record-not-shared", what="units sharing the root's "
                      "execution-order record")  # fmt: skip
        for moment in ("after forward", "after backward"):
            if moment == "after backward":
                loss.backward()
            observed = {
                "post_forward": _order(model, eod.handles_post_forward_order),
                "pre_forward": _order(model, eod.handles_pre_forward_order),
                "iter": eod._iter,
            }
            want = {
                "post_forward": list(POST_FORWARD) if moment == "after forward" else [],
                "pre_forward": list(PRE_FORWARD),
                "iter": it - 1 if moment == "after forward" else it,
            }
            where = f"iteration {it}, {moment}"
            reasons = {"post_forward": "post-forward-order", "pre_forward": "pre-forward-order", "iter": "iteration"}
            for key, reason in reasons.items():
                require_equal(observed[key], want[key], reason=reason, what=f"{where}: {key}", iteration=it,
                              moment=moment)  # fmt: skip
            seen[where] = {**observed, "post_forward_count": len(observed["post_forward"])}
    return seen


# -- claim: _finalize_params moves the sharded gradient to .grad -----------------------------------------------
def _grad_state(unit: FSDP) -> dict[str, Any]:
    flat = unit._handle.flat_param
    saved = getattr(flat, "_saved_grad_shard", None)
    views = [p.grad.untyped_storage().data_ptr() for p in flat._params if p.grad is not None]
    return {
        "grad": flat.grad,
        "saved": saved,
        "has_saved": hasattr(flat, "_saved_grad_shard"),
        "post_backward_called": flat._post_backward_called,
        "view_storages": sorted(set(views)),
    }


def finalize_moves_shard_to_grad(ctx: RankContext) -> dict[str, Any]:
    """Observed as each unit's `_finalize_params` starts, and after backward: it enters with ``.grad`` None, the
    reduced shard in ``_saved_grad_shard`` (of the layout model's shard length) and ``_post_backward_called``
    True; it leaves that same tensor as ``.grad`` (no copy), ``_saved_grad_shard`` gone and
    ``_post_backward_called`` False. The original parameters' gradients are views into it throughout."""
    model = fsdp1_gpt(ctx)
    names = _names(model)
    shard = {name: layout(numels, 4, ctx.world_size).shard_numel for name, numels in unit_numels().items()}
    seen: dict[str, dict[str, Any]] = {}

    def on_finalize(frame: types.FrameType) -> None:
        unit = frame.f_locals["state"]
        seen[names[id(unit)]] = {"before": _grad_state(unit)}

    _, loss = model(*batch(ctx))
    with _observing({FINALIZE: on_finalize}):
        loss.backward()
    for name, unit in units(model).items():  # nothing after `_finalize_params` touches the gradient
        seen.get(name, {})["after"] = _grad_state(unit)
    require_equal(sorted(seen), sorted(shard), reason="not-finalized", what="units through _finalize_params")
    report = {}
    for name, s in seen.items():
        before, after = s["before"], s["after"]
        saved = before["saved"]
        observed = {
            "before": {"grad": before["grad"] is not None, "saved_numel": saved.numel() if saved is not None else None,
                       "post_backward_called": before["post_backward_called"]},
            "after": {"grad_is_saved_shard": after["grad"] is saved and saved is not None,
                      "has_saved": after["has_saved"], "post_backward_called": after["post_backward_called"]},
        }  # fmt: skip
        want = {
            "before": {"grad": False, "saved_numel": shard[name], "post_backward_called": True},
            "after": {"grad_is_saved_shard": True, "has_saved": False, "post_backward_called": False},
        }
        for moment, reason in (("before", "not-reduced-before-finalize"), ("after", "grad-not-moved")):
            require_equal(observed[moment], want[moment], reason=reason, what=f"{name} {moment} _finalize_params",
                          unit=name)  # fmt: skip
        storage = after["grad"].untyped_storage().data_ptr()
        views = {"before": before["view_storages"], "after": after["view_storages"]}
        require_equal(views, {"before": [storage], "after": [storage]}, reason="grad-views-elsewhere",
                      what=f"{name}: storages of the original parameters' gradients", unit=name)  # fmt: skip
        report[name] = observed
    return report


# -- claims: HYBRID_SHARD --------------------------------------------------------------------------------------
def _hybrid_gpt(ctx: RankContext, groups: str) -> FSDP:
    """mini_gpt tiny under HYBRID_SHARD. ``default``: FSDP builds the groups (it requires an auto-wrap policy for
    that); ``shard-over-world``: the world as the shard group and a one-rank replicate group."""
    if groups == "default":
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the clamp's warning (guide 09)
            model = GPT(preset("tiny"), seed=0).to(ctx.device)
            return FSDP(model, device_id=ctx.device, use_orig_params=True, auto_wrap_policy=ModuleWrapPolicy({Block}),
                        sharding_strategy=ShardingStrategy.HYBRID_SHARD)  # fmt: skip
    if groups == "shard-over-world":
        alone = one_rank_group(ctx)
        return fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy.HYBRID_SHARD, process_group=(dist.group.WORLD, alone))
    raise ValueError(f"unknown groups {groups!r}")


def _ddp_named(ddp: nn.Module, attribute: str) -> dict[str, torch.Tensor]:
    return {name.removeprefix("module."): getattr(p, attribute) for name, p in ddp.named_parameters()}


def _shard_of(unit: FSDP) -> tuple[int, int]:
    """(ranks, rank) the unit shards over: its shard group, or one rank under NO_SHARD (the whole gradient)."""
    if unit._handle.uses_sharded_strategy:
        return unit.process_group.size(), unit.process_group.rank()
    return 1, 0


def hybrid_shard_averages_over_replicas(ctx: RankContext, groups: str = "default") -> dict[str, Any]:
    """What a user expects of HYBRID_SHARD with the default groups: after one backward, every replica holds the
    same gradient, and it is DDP's (bitwise: at two ranks every correct mean is a/2 + b/2 in some order, exact).
    With ``groups="default"`` the groups must first be what the source builds: a shard group of
    `device_count()` ranks (1 on CPU) and a replicate group of the rest."""
    model = _hybrid_gpt(ctx, groups)
    shard_pg, replicate_pg = model.process_group, model._inter_node_pg
    sizes = {"shard": shard_pg.size(), "replicate": replicate_pg.size(),
             "device_count": model._device_handle.device_count()}  # fmt: skip
    if groups == "default":
        want = {"shard": sizes["device_count"], "replicate": ctx.world_size // sizes["device_count"],
                "device_count": 1 if ctx.device.type == "cpu" else sizes["device_count"]}  # fmt: skip
        require_equal(sizes, want, reason="default-groups", what="(shard, replicate) group sizes and device count")
    strategies = sorted({u._handle._sharding_strategy.name for u in units(model).values()})
    x, y = batch(ctx)
    with record_comm() as comm:
        _, loss = model(x, y)
        loss.backward()
    ddp = ddp_gpt(ctx)
    ddp(x, y)[1].backward()
    reference = _ddp_named(ddp, "grad")
    spans = sorted({(c.op, c.group_size) for c in comm if c.in_backward})
    for name, unit in units(model).items():
        grad = unit._handle.flat_param.grad.detach()
        peers = [torch.empty_like(grad) for _ in range(replicate_pg.size())]
        dist.all_gather(peers, grad, group=replicate_pg)
        differing = [dist.get_global_rank(replicate_pg, i) for i, g in enumerate(peers) if not torch.equal(g, grad)]
        worst = max(float((g - grad).abs().max()) for g in peers)
        require(not differing, "replicas-not-synced", f"{name}: rank {ctx.rank}'s gradient differs from replicas "
                f"{differing} by up to {worst:.3g}", unit=name, differing=differing, max_abs_diff=worst,
                strategies=strategies, spans=spans, sizes=sizes)  # fmt: skip
        world, rank = _shard_of(unit)
        expected = grad_shards(reference, world, rank)[name]
        require(torch.equal(grad, expected), "not-ddp-gradient", f"{name}: synced, but not DDP's gradient (max |Δ| "
                f"{float((grad - expected).abs().max()):.3g})", unit=name, strategies=strategies)  # fmt: skip
    return {"sizes": sizes, "strategies": strategies, "spans": spans}


def _two_by_two(ctx: RankContext) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """Shard groups {0,1},{2,3}; replicate groups {0,2},{1,3} (every rank creates every group, in one order)."""
    require_equal(ctx.world_size, 4, reason="needs-four-ranks", what="world size")
    shard = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    replicate = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    return shard[ctx.rank // 2], replicate[ctx.rank % 2]


def _flat(model: FSDP, what: str) -> dict[str, torch.Tensor]:
    out = {}
    for name, unit in units(model).items():
        flat = unit._handle.flat_param
        out[name] = (flat.grad if what == "grad" else flat).detach().clone().cpu()
    return out


def _worst(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> tuple[float, int]:
    diffs = [(got[n] - want[n]).abs() for n in want]
    return max(float(d.max()) for d in diffs), sum(int((d > 0).sum()) for d in diffs)


def hybrid_2x2_matches_ddp(ctx: RankContext, bound: float, grad_bound: float, steps: int = 3) -> dict[str, Any]:
    """HYBRID_SHARD over shard groups of 2 and replicate groups of 2 on four ranks. Each backward issues, per unit
    in post-backward order, a reduce-scatter of the unit's padded size (layout model, two shards) over the shard
    group, then an all-reduce of one shard over the replicate group. The first gradients are a summation order
    of the four local gradients; over ``steps`` AdamW steps gradients stay within ``grad_bound`` of DDP's (laid out
    as this rank's shard of two), parameters and losses within ``bound``."""
    shard_pg, replicate_pg = _two_by_two(ctx)
    model = fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy.HYBRID_SHARD, process_group=(shard_pg, replicate_pg))
    ddp = ddp_gpt(ctx)
    optims = make_optimizer(model, LR), make_optimizer(ddp, LR)
    shard_ranks = tuple(sorted(dist.get_process_group_ranks(shard_pg)))
    replicate_ranks = tuple(sorted(dist.get_process_group_ranks(replicate_pg)))
    layouts = {name: layout(numels, 4, shard_pg.size()) for name, numels in unit_numels().items()}
    expected_comm = []
    for name in post_backward_order():
        expected_comm.append(f"reduce_scatter {layouts[name].padded_numel} over {shard_ranks}")
        expected_comm.append(f"all_reduce {layouts[name].shard_numel} over {replicate_ranks}")
    grads, params, loss_gaps, counts = [], [], [], []
    start, scale = _flat(model, "param"), 0.0
    for step in range(steps):
        x, y = batch(ctx, step=step)
        with record_comm() as comm:
            _, loss = model(x, y)
            loss.backward()
        _, ref = ddp(x, y)
        ref.backward()
        reduced = [c for c in comm if c.op in ("reduce_scatter", "all_reduce")]
        reductions = [f"{c.op} {c.numel} over {c.group_ranks}" for c in reduced]
        assert_sequence(reductions, expected_comm, what=f"step {step + 1}: gradient reductions", reason="reductions")
        callers = sorted({c.caller.split(":")[1] for c in comm if c.op != "all_gather"})
        require_equal(callers, ["_reduce_grad"], reason="reduction-caller", what=f"step {step + 1}: callers")
        gathers = sorted({c.group_ranks for c in comm if c.op == "all_gather"})
        require_equal(gathers, [shard_ranks], reason="gather-group", what=f"step {step + 1}: all-gather groups")
        shard_rank = shard_pg.rank()
        want_grads = grad_shards(_ddp_named(ddp, "grad"), shard_pg.size(), shard_rank)
        got_grads = _flat(model, "grad")
        if step == 0:
            _summation_order(ctx, got_grads, (x, y), (shard_pg.size(), shard_rank))
            scale = max(float(g.abs().max()) for g in want_grads.values())
        grads.append(_worst(got_grads, want_grads))
        loss_gaps.append(abs(float(loss.detach()) - float(ref.detach())))
        counts.append(len(reductions))
        for optim in optims:
            optim.step()
            optim.zero_grad(set_to_none=True)
        params.append(_worst(_flat(model, "param"), grad_shards(_ddp_named(ddp, "data"), shard_pg.size(),
                                                                    shard_rank)))  # fmt: skip
    # Every rank's worst, so each rank judges (and reports) the same numbers.
    moved = max(float((p - start[n]).abs().max()) for n, p in _flat(model, "param").items())
    everyone = ctx.gather({"grads": grads, "params": params, "loss": max(loss_gaps), "scale": scale, "moved": moved})
    worst_grad = [max(r["grads"][i][0] for r in everyone) for i in range(steps)]
    worst_param = [max(r["params"][i][0] for r in everyone) for i in range(steps)]
    for step, (g, p) in enumerate(zip(worst_grad, worst_param, strict=True), start=1):
        require(g <= grad_bound, "grad-beyond-bound", f"step {step}: max |grad - DDP's| = {g:.3g} > {grad_bound}",
                step=step, observed=g, bound=grad_bound)  # fmt: skip
        require(p <= bound, "param-beyond-bound", f"after step {step}: max |param - DDP's| = {p:.3g} > {bound}",
                step=step, observed=p, bound=bound)  # fmt: skip
    loss_gap = max(r["loss"] for r in everyone)
    require(loss_gap <= bound, "loss-beyond-bound", f"max |loss - DDP's| = {loss_gap:.3g} > {bound}",
            observed=loss_gap, bound=bound)  # fmt: skip
    return {
        "reductions_per_backward": counts[0],
        "grad_max_abs_diff": worst_grad,
        # Ranks 0 and 1 hold one copy of every element between them (2 and 3 hold the replica's).
        "grad_elements_differing": [sum(r["grads"][i][1] for r in everyone[:2]) for i in range(steps)],
        "param_max_abs_diff": worst_param,
        "loss_max_abs_diff": loss_gap,
        "step_1_max_abs_grad": max(r["scale"] for r in everyone),
        "moved": max(r["moved"] for r in everyone),
    }


def _summation_order(
    ctx: RankContext, got: dict[str, torch.Tensor], data: tuple[Any, Any], shard: tuple[int, int]
) -> None:
    """Every element of this rank's first sharded gradient, times N, is an fp32 pairwise sum of the N ranks'
    local gradients (the unwrapped replica's, gathered): a summation order, nothing else."""
    replica = GPT(preset("tiny"), seed=0).to(ctx.device)
    world, rank = shard
    replica(*data)[1].backward()
    named = [(n, p.grad.detach().cpu()) for n, p in replica.named_parameters()]
    whole = torch.cat([g.flatten() for _, g in named])
    gathered = [torch.empty_like(whole) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, whole)  # whole local gradients: the ranks hold different shard indices
    everyone = []
    for flat in gathered:
        grads, start = {}, 0
        for n, g in named:
            grads[n] = flat[start : start + g.numel()].view_as(g)
            start += g.numel()
        shards = grad_shards(grads, world, rank)  # this rank's shard of that rank's local gradient
        everyone.append(torch.cat([shards[n] for n in got]))
    sums = torch.stack(pairwise_sums(everyone))
    observed = torch.cat([got[n] for n in got]) * ctx.world_size
    unexplained = int((~(sums == observed).any(dim=0)).sum())
    require(unexplained == 0, "not-a-summation-order", f"{unexplained} gradient elements × {ctx.world_size} are no "
            f"fp32 sum of the local gradients", observed=unexplained)  # fmt: skip


# -- break-it recipes: this guide's behaviour bent on purpose (tests/break_it/ applies them) --------------------
def final_callback_keeping_hook_flags(original: Any, state: Any, module: Any) -> None:
    """The final callback, after which every handle still says its pre-backward hook ran."""
    original(state, module)
    for unit in state._all_fsdp_states:
        if unit._handle:
            unit._handle._ran_pre_backward_hook = True


def final_callback_left_queued(original: Any, state: Any, module: Any) -> None:
    """The final callback without its last line: the root still believes a callback is queued."""
    original(state, module)
    state._post_backward_callback_queued = True


def final_callback_resetting_first(original: Any, state: Any, module: Any) -> None:
    """Resets done before the callback runs instead of by it (wrong timing: the callback then finds them done)."""
    for unit in state._all_fsdp_states:
        unit.training_state = type(unit.training_state).IDLE
        if unit._handle:
            handle = unit._handle
            handle._training_state = type(handle._training_state).IDLE
            handle._ran_pre_backward_hook = False
            handle._post_forward_index = None
    original(state, module)


def catch_all_without_free(original: Any, state: Any) -> None:
    """`_catch_all_reshard` that points the flat parameter back at its shard but keeps the unsharded storage."""
    from torch.distributed.fsdp import _runtime_utils

    real = _runtime_utils._should_free_in_backward
    _runtime_utils._should_free_in_backward = lambda *args: False
    try:
        original(state)
    finally:
        _runtime_utils._should_free_in_backward = real


def pre_backward_then_free(original: Any, state: Any, module: Any, handle: Any, grad: Any, *unused: Any) -> Any:
    """`_pre_backward_hook` that frees a non-root unit's parameters right after unsharding them: the catch-all
    later finds it resharded (a reshard at the wrong time, in the hook instead of the callback)."""
    from torch.distributed.fsdp import _runtime_utils

    out = original(state, module, handle, grad, *unused)
    if handle and not state._is_root:
        _runtime_utils._reshard(state, handle, True)
    return out


def next_iter_without_clear(original: Any, self: Any) -> None:
    """`_ExecOrderData.next_iter` that keeps the post-forward order."""
    kept = list(self.handles_post_forward_order)
    original(self)
    self.handles_post_forward_order.extend(kept)


def next_iter_without_count(original: Any, self: Any) -> None:
    """`_ExecOrderData.next_iter` that does not count the iteration."""
    original(self)
    self._iter -= 1


def next_iter_clearing_pre_forward(original: Any, self: Any) -> None:
    """`_ExecOrderData.next_iter` that also forgets the pre-forward order."""
    original(self)
    self.handles_pre_forward_order.clear()


def finalize_copying_grad(original: Any, self: Any) -> None:
    """`prepare_gradient_for_optim` that hands the optimizer a copy of the sharded gradient."""
    original(self)
    flat = self.flat_param
    if flat.grad is not None:
        flat.grad = flat.grad.clone()


def finalize_keeping_called(original: Any, state: Any) -> None:
    """`_finalize_params` that leaves ``_post_backward_called`` True."""
    original(state)
    if state._handle and state._handle.flat_param.requires_grad:
        state._handle.flat_param._post_backward_called = True
