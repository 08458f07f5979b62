"""One step of a user's model under FSDP1, FSDP2 or DDP on the rank pool, measured by the probes (rank side):
what FSDP built (DDP: its buckets and the gradient-ready order they follow; ZeroRedundancyOptimizer: its
partition), what a rank holds after a step, the collectives of a steady step, each backward-prefetch mode's
hooks, and one step's gradients against DDP's. Nothing here predicts: `checks.inspect.predict` does, and
`checks.inspect.compare` puts the two side by side.

First, every rank runs the plain model once on its batch and records what it reached (`reach_of`); the ranks
gather that, and refuse together what the strategy cannot take (`checks.inspect.reach`), before any of the
strategy's collectives.

The batch comes from the input factory, called with no arguments under ``torch.manual_seed(97 * step + rank)``,
and the forward runs on under that seed: every rank its own batch, the same on every run, and every forward of
one step on one rank draws the same random numbers (dropout). It may return a tensor, a tuple of positional
arguments or a dict of keyword arguments. The loss is the output's ``loss`` when it has one (a dict key or an
attribute, as Hugging Face models return with ``labels``), else the sum of every floating-point tensor the model
returns.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from checks.guides.g06_backward_prefetch.backward_runs import HOOK_KINDS, recorded_post_forward
from checks.inspect import loading
from checks.inspect.predict import (
    DDP,
    FSDP1,
    FSDP2,
    REFERENCE,
    Usage,
    group_paths,
    modes,
    reference_groups,
    relative_name,
)
from checks.inspect.reach import RankReach, Reach, refusal
from checks.naming import ROOT, clean
from checks.probes.built_units import fsdp1_units
from checks.probes.comm import record_comm
from checks.probes.events import record_events
from checks.probes.grad_ready import ready_order, record_grad_ready
from checks.probes.memory import snapshot
from checks.probes.memory_series import record_memory_series
from checks.ranks.context import RankContext
from checks.violation import Violation
from checks.workloads.data_parallel import make
from checks.workloads.module_tree import classes_of, module_paths, tree_of
from checks.workloads.wrap_policies import torch_policy

LR = 1e-3


class BatchRejected(Exception):
    """The model raised on the input factory's batch: the message is the model's own error."""


class ModelRefused(Violation):
    """What the model did with its batch is something the strategy cannot take (`checks.inspect.reach`): its
    reason is the refusal's, the message says what and what to do. Every rank raises it, from the same gathered
    facts."""


def reach_of(model: nn.Module, forward_backward: Callable[[nn.Module], None]) -> RankReach:
    """Which modules ran in ``forward_backward``, which returned a tensor needing a gradient, and which
    parameters got one (`checks.inspect.reach`)."""
    ran: set[str] = set()
    grad_output: set[str] = set()
    outputs: list[tuple[str, list[torch.Tensor]]] = []  # held until the root's output is known, so ids stay valid

    def record(path: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            ran.add(path)
            tensors = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
            if tensors:
                grad_output.add(path)
                outputs.append((path, tensors))

        return hook

    handles = [m.register_forward_hook(record(clean(path))) for path, m in model.named_modules()]
    try:
        forward_backward(model)
    finally:
        for handle in handles:
            handle.remove()
    final = {id(t) for path, tensors in outputs if path == "" for t in tensors}
    returned_by = tuple(path for path, tensors in outputs if path and any(id(t) in final for t in tensors))
    outputs.clear()
    grads = frozenset(clean(n) for n, p in model.named_parameters() if p.grad is not None)
    return RankReach(frozenset(ran), frozenset(grad_output), grads, returned_by)


def _fsdp1_grad_output(spec: str, build: Callable[[], Any], make_batch: Callable[[], Any], ctx: RankContext,
                       units: dict[str, list[str]]) -> frozenset[str]:  # fmt: skip
    """The modules whose output needs a gradient as FSDP1 runs them. In forward a unit's parameters are plain
    views of its flat parameter (``_use_unsharded_views(as_params=False)``), which need a gradient when the flat
    parameter does, that is when any of them is trained: a frozen parameter beside a trained one takes part in
    autograd there. So: the plain model once more, with those parameters' flags set so."""
    plain = loading.build_for_real(spec, build).to(ctx.device)
    params = dict((clean(n), p) for n, p in plain.named_parameters())
    for names in units.values():
        if any(params[n].requires_grad for n in names if n in params):
            for n in names:
                if n in params:
                    params[n].requires_grad_(True)
    return reach_of(plain, lambda module: loss_of(forward(module, make_batch, ctx, 0)).backward()).grad_output


def unit_params(spec: str, build: Callable[[], Any], wrap: dict[str, Any] | None,
                strategy: str) -> dict[str, list[str]]:  # fmt: skip
    """Each unit's path and the parameters it holds by full name, as the strategy will build them (the wrap
    model's units; the reference stages' groups); none under DDP."""
    from checks.models import wrap as wm
    from checks.workloads.wrap_policies import model_policy

    if strategy in DDP:
        return {}
    model = loading.build_on_meta_or_cpu(spec, build)
    units = wm.wrap(tree_of(model), model_policy(wrap))
    if strategy in REFERENCE:
        shapes = {clean(n): tuple(p.shape) for n, p in model.named_parameters()}
        usage = Usage(trainable=frozenset(clean(n) for n, p in model.named_parameters() if p.requires_grad))
        return {("" if g == ROOT else g): names for g, names in reference_groups(units, shapes, usage).items()}
    return {u.path: [wm.join(u.path, name) for name, _ in u.params] for u in units.units}


def forward(model: nn.Module, make_batch: Callable[[], Any], ctx: RankContext, step: int,
            dtype: torch.dtype | None = None) -> Any:  # fmt: skip
    """``model``'s output on this rank's batch of ``step``: the batch and the forward both drawn under seed
    ``97 * step + rank``, so every forward of one step on one rank draws the same random numbers (dropout's
    masks), whichever wrapper runs it; the seeded state is then dropped. ``dtype``: the batch's floating-point
    tensors cast to it (the float64 rerun)."""
    with torch.random.fork_rng(devices=[ctx.device] if ctx.device.type == "cuda" else []):
        torch.manual_seed(97 * step + ctx.rank)
        batch = make_batch()
        if dtype is not None:
            batch = tree_map(lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
                             batch)  # fmt: skip
        return call(model, batch)


def call(model: nn.Module, batch: Any) -> Any:
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, tuple | list):
        return model(*batch)
    return model(batch)


def loss_of(output: Any) -> torch.Tensor:
    """See the module docstring."""
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss.float().sum()
    leaves = tree_leaves(output)  # dicts, tuples, lists, Hugging Face's ModelOutput
    floats = [t.float().sum() for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()
              and t.requires_grad]  # fmt: skip
    if not floats:
        raise BatchRejected("the model returned no floating-point tensor that needs a gradient: nothing to train")
    return torch.stack(floats).sum()


def _fsdp1(model: nn.Module, ctx: RankContext, spec: dict[str, Any] | None, strategy: str, mode: str | None) -> Any:
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    policy = torch_policy(spec, module_paths(model), classes_of(model))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return FSDP(model, auto_wrap_policy=policy, sharding_strategy=ShardingStrategy[strategy],
                    backward_prefetch=BackwardPrefetch[mode] if mode else None, device_id=ctx.device,
                    use_orig_params=True)  # fmt: skip


def _layout(wrapped: nn.Module) -> dict[str, dict[str, int]]:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from checks.naming import unit_name

    out = {}
    for path, module in wrapped.named_modules():
        if isinstance(module, FSDPModule) and (group := module._get_fsdp_state()._fsdp_param_group) is not None:
            n = group.mesh_info.shard_mesh_size
            shard = sum(p.padded_sharded_param_size.numel() for p in group.fsdp_params)
            numel = sum(p._orig_size.numel() for p in group.fsdp_params)
            out[unit_name(path)] = {"numel": numel, "padded": shard * n, "shard": shard, "padding": shard * n - numel}
    for path, module in wrapped.named_modules():
        if isinstance(module, FSDP) and module._handle is not None:
            flat = module._handle.flat_param
            numel = sum(flat._numels)  # NO_SHARD keeps the whole (aligned) flat parameter: no all-gather buffer
            padded = flat._padded_unsharded_size.numel() if module._handle.uses_sharded_strategy else flat.numel()
            out[unit_name(path)] = {"numel": numel, "padded": padded, "shard": flat._sharded_size.numel(),
                                    "padding": padded - numel}  # fmt: skip
    return out


def diagrams(wrapped: nn.Module, ctx: RankContext) -> dict[str, dict[str, Any]]:
    """Each unit's flat parameter as guide 12's layout diagram reads it (`checks.guides.g12_flat_parameter.layout`)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from checks.guides.g12_flat_parameter.layout import real_layout
    from checks.naming import unit_name

    return {
        unit_name(path): real_layout(module, ctx, title=unit_name(path))
        for path, module in wrapped.named_modules()
        if isinstance(module, FSDP) and module._handle is not None
    }


def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance in fp32 units in the last place between two tensors (0: bitwise equal)."""
    if torch.equal(a, b):
        return 0

    def ordered(t: torch.Tensor) -> torch.Tensor:
        bits = t.detach().float().contiguous().view(torch.int32).long()
        return torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)

    return int((ordered(a) - ordered(b)).abs().max())


def measure(
    ctx: RankContext,
    model: str,
    batch: str,
    *,
    wrap: dict[str, Any] | None,
    strategy: str,
    optimizer: str = "adamw",
    find_unused_parameters: bool = False,
) -> dict[str, Any]:
    """The measurements `checks.inspect.compare` reads (see the module docstring); ``strategy`` is one of
    `checks.inspect.predict.MEASURED`."""
    build, _ = loading.factory(model, "the model")
    make_batch, _ = loading.factory(batch, "--input")
    plain = loading.build_for_real(model, build).to(ctx.device)
    try:
        mine = reach_of(plain, lambda module: loss_of(forward(module, make_batch, ctx, 0)).backward())
    except BatchRejected:
        raise
    except Exception as exc:
        raise BatchRejected(f"{model} rejected the batch of {batch}: {type(exc).__name__}: {exc}") from exc
    trainable = frozenset(clean(n) for n, p in plain.named_parameters() if p.requires_grad)
    del plain
    units = unit_params(model, build, wrap, strategy)
    if strategy in FSDP1:
        mine = replace(mine, grad_output=_fsdp1_grad_output(model, build, make_batch, ctx, units))
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine.as_json())  # the same call on every rank: all refuse, or none
    reach = Reach(tuple(RankReach.from_json(doc) for doc in everyone), trainable)
    if why := refusal(reach, strategy, units, find_unused_parameters=find_unused_parameters):
        raise ModelRefused(why.reason, why.message)

    def wrapped(mode: str | None = "BACKWARD_PRE", dtype: torch.dtype = torch.float32) -> nn.Module:
        fresh = loading.build_for_real(model, build).to(dtype)
        if strategy in DDP:
            from checks.workloads.toy import wrap_ddp

            return wrap_ddp(fresh, ctx, find_unused_parameters=find_unused_parameters)
        if strategy in FSDP2:
            return _fsdp2(fresh, ctx, wrap, FSDP2[strategy])
        return _fsdp1(fresh, ctx, wrap, FSDP1[strategy], mode)

    if strategy in REFERENCE:
        out = _reference(ctx, model, build, make_batch, wrap=wrap, strategy=strategy, optimizer=optimizer,
                         reach=reach)  # fmt: skip
        return {**out, "reach": list(everyone)}
    first = wrapped()
    optim = _optimizer(strategy, optimizer, first)
    out = {**steady_step(ctx, first, optim, make_batch), "prefetch": {}}
    for mode in modes(strategy):
        model_ = wrapped(None if mode in ("None", "implicit") else mode)
        output = forward(model_, make_batch, ctx, 0)
        order = post_forward_order(model_)
        with record_events(model_, label=f"inspect {mode}") as events:
            loss_of(output).backward()
        kinds = HOOK_KINDS if strategy in FSDP1 else ("prefetch",)
        out["prefetch"][str(mode)] = {"post_forward": order,
                                      "hooks": [e.describe() for e in events if e.kind in kinds]}  # fmt: skip
    fresh = [loading.build_for_real(model, build) for _ in range(2)]
    sharded = wrapped() if strategy != "ddp" else None  # DDP is the reference itself

    def in_float64() -> tuple[nn.Module, Any]:
        return loading.build_for_real(model, build).double(), wrapped(dtype=torch.float64)

    out["gradients"] = gradients_against_ddp(ctx, make_batch, local=fresh[0], reference=fresh[1], sharded=sharded,
                                             reach=reach,
                                             float64=in_float64 if sharded is not None else None)  # fmt: skip
    out["reach"] = list(everyone)
    return out


class _Engine:
    """A reference ZeRO stage (`checks.zero`) stepped as an optimizer is, so that the steady step runs it."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def step(self) -> None:
        self.engine.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.engine.zero_grad()


def _reference(ctx: RankContext, spec: str, build: Callable[[], Any], make_batch: Callable[[], Any], *,
               wrap: dict[str, Any] | None, strategy: str, optimizer: str, reach: Reach) -> dict[str, Any]:  # fmt: skip
    """A reference ZeRO stage on the user's model, its groups the policy's units (`checks.inspect.predict`):
    its groups and their flat layout, the bytes it holds (its own shards included, `data_parallel.held_bytes`), a steady
    step's collectives and its gradients against DDP's."""
    from functools import partial

    from checks.models import wrap as wm
    from checks.workloads.data_parallel import Trained, held_bytes
    from checks.workloads.wrap_policies import model_policy
    from checks.zero import STAGES

    def engine(dtype: torch.dtype = torch.float32) -> Any:
        model = loading.build_for_real(spec, build).to(ctx.device, dtype)
        paths = group_paths(wm.wrap(tree_of(model), model_policy(wrap)))
        return STAGES[REFERENCE[strategy]](model, paths, make_optimizer=partial(make, optimizer, lr=LR))

    first = engine()
    trained = Trained(strategy, first.model, first.optim, first.step, first.zero_grad, first.full_params,
                      first.full_grads, first.held)  # fmt: skip
    out = steady_step(ctx, first.model, _Engine(first), make_batch, held=lambda: held_bytes(trained))
    out["units"] = {g.name: {"type": type(first.model.get_submodule("" if g.name == ROOT else g.name)).__name__,
                             "params": [[relative_name(n, g.name), p.numel()] for n, p in zip(g.names, g.params,
                                                                                       strict=True)]}
                    for g in first.groups}  # fmt: skip
    out["layout"] = {g.name: {"numel": g.numel, "padded": g.padded, "shard": g.shard_numel,
                              "padding": g.padded - g.numel} for g in first.groups}  # fmt: skip
    out["prefetch"] = {}
    fresh = [loading.build_for_real(spec, build) for _ in range(2)]

    def in_float64() -> tuple[nn.Module, Any]:
        return loading.build_for_real(spec, build).double(), engine(torch.float64)

    out["gradients"] = gradients_against_ddp(ctx, make_batch, local=fresh[0], reference=fresh[1], sharded=engine(),
                                             reach=reach, float64=in_float64)  # fmt: skip
    return out


def _optimizer(strategy: str, name: str, wrapped: nn.Module) -> torch.optim.Optimizer:
    """``name`` over the wrapped model's parameters; for torch-zero, ZeroRedundancyOptimizer around it."""
    if strategy != "torch-zero":
        return make(name, wrapped.parameters(), LR)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from checks.workloads.data_parallel import optimizer_class

    cls, kwargs = optimizer_class(name)
    return ZeroRedundancyOptimizer(wrapped.parameters(), optimizer_class=cls, lr=LR, **kwargs)


def post_forward_order(model: nn.Module) -> list[str]:
    """The units in the order torch recorded their post-forwards this iteration (read before backward clears it);
    none for a model FSDP does not wrap (DDP, a reference ZeRO stage)."""
    from torch.distributed.fsdp import FSDPModule

    if hasattr(model, "_exec_order_data"):
        return recorded_post_forward(model)[0]
    if not isinstance(model, FSDPModule):
        return []
    from checks.guides.g17_fsdp2_prefetch.steps import torch_post_forward_order

    return torch_post_forward_order(model)


def _fsdp2(model: nn.Module, ctx: RankContext, spec: dict[str, Any] | None, reshard: bool | None) -> nn.Module:
    """``fully_shard`` on each module FSDP1's policy would make a unit, children first, the root last (see
    `checks.inspect.predict`)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from checks.models import wrap as wm
    from checks.workloads.wrap_policies import model_policy

    units = wm.wrap(tree_of(model), model_policy(spec)).units
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    modules = dict(model.named_modules())
    kwargs = {} if reshard is None else {"reshard_after_forward": reshard}
    for unit in units:
        fully_shard(modules[unit.path], mesh=mesh, **kwargs)
    return model


def _units(wrapped: nn.Module) -> dict[str, dict[str, Any]]:
    if hasattr(wrapped, "reducer"):  # DDP: no units
        return {}
    if hasattr(wrapped, "_exec_order_data"):
        return fsdp1_units(wrapped)
    from torch.distributed.fsdp import FSDPModule

    from checks.naming import unit_name
    from checks.probes.built_units import fsdp2_group

    out = {}
    for path, module in wrapped.named_modules():
        if isinstance(module, FSDPModule):
            sizes = {clean(n): p.numel() for n, p in module.named_parameters()}
            names = fsdp2_group(module)
            original = next(c for c in type(module).__mro__ if not issubclass(c, FSDPModule))
            out[unit_name(path)] = {"type": original.__name__,
                                    "params": [[n, _global_numel(module, n, sizes)] for n in names]}  # fmt: skip
    return out


def _global_numel(module: nn.Module, name: str, sizes: dict[str, int]) -> int:
    """A parameter's whole size: a DTensor's global shape, not its local shard."""
    param = module.get_parameter(name)
    return int(torch.Size(param.shape).numel()) if param is not None else sizes[name]


def steady_step(ctx: RankContext, wrapped: nn.Module, optim: Any, make_batch: Callable[[], Any],
                held: Callable[[], dict[str, int]] | None = None) -> dict[str, Any]:  # fmt: skip
    """What FSDP built (units, layout; DDP: buckets), the bytes a rank holds after one step with its gradients
    kept, and the collectives of a steady step, each with its phase (forward, backward, or the optimizer's step):
    the second (lazy initialisation and the optimizer's state are the first's), or under DDP the third (the
    second's forward rebuilds the buckets, over the first's gradient-ready order). ``held``: what a rank holds,
    when the probe's snapshot cannot see it (the reference ZeRO stages' shards)."""
    is_ddp = hasattr(wrapped, "reducer")
    account = held or (lambda: snapshot(wrapped, optim).by_category)
    steps: list[int] = []

    def step(number: int, comm: Any = None) -> list[str]:
        output = forward(wrapped, make_batch, ctx, number)
        order = post_forward_order(wrapped)
        loss_of(output).backward()
        before = len(comm) if comm is not None else 0
        optim.step()
        if comm is not None:
            steps.extend(range(before, len(comm)))
        return order

    with record_grad_ready(wrapped) if is_ddp else contextlib.nullcontext() as ready:
        step(0)
        after_one = account()
        optim.zero_grad(set_to_none=True)
        if is_ddp:
            step(1)
            optim.zero_grad(set_to_none=True)
        with (
            record_comm() as comm,
            record_events(wrapped, label="inspect: a steady step"),
            record_memory_series(wrapped, optim) as recorder,  # its points: FSDP1's hooks only
        ):
            points = [("start", account())]
            recorder.mark("start")
            order = step(2 if is_ddp else 1, comm)
            recorder.mark("after step")
            points.append(("after step", account()))
    in_step = set(steps)
    out = {
        "units": _units(wrapped),
        "layout": _layout(wrapped),
        "diagrams": diagrams(wrapped, ctx) if hasattr(wrapped, "_exec_order_data") else {},
        "series": {
            f"bytes held over the {'third' if is_ddp else 'second'} step": points if held else recorder.series.points
        },
        "memory": after_one,
        "collectives": [
            {
                "op": c.op,
                "numel": c.numel,
                "phase": "step" if i in in_step else "backward" if c.in_backward else "forward",
            }
            for i, c in enumerate(comm)
        ],
        "post_forward": [u for u in order if u != ROOT],
    }
    if is_ddp:
        from checks.guides.g19_ddp_buckets.ddp_runs import reducer_buckets

        out["ready"] = ready_order(ready, 1)
        out["buckets"] = reducer_buckets(wrapped)
        out["partition"] = _partition(wrapped, optim)
    return out


def _partition(ddp: nn.Module, optim: torch.optim.Optimizer) -> list[list[str]] | None:
    """ZeroRedundancyOptimizer's parameters per rank (``_partition_parameters``), by name; None for another."""
    if not hasattr(optim, "_partition_parameters"):
        return None
    names = {id(p): clean(n) for n, p in ddp.module.named_parameters()}
    return [[names[id(p)] for group in groups for p in group["params"]] for groups in optim._partition_parameters()]


def gradients_against_ddp(
    ctx: RankContext, make_batch: Callable[[], Any], *, local: nn.Module, reference: nn.Module,
    sharded: nn.Module | None, reach: Reach, float64: Callable[[], tuple[nn.Module, Any]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One backward of the same weights and batches, three ways: unwrapped on each rank alone (``local``: the N
    terms of every reduced element), under DDP (``reference``) and under the strategy inspected (``sharded``; its
    whole gradient from FSDP1's ``summon_full_params(with_grads=True)``, FSDP2's ``full_tensor()``, or a DDP's
    module; None when the strategy is DDP itself, then only DDP's side is reported). The expected values are
    the fp32 sums of the N terms, added in any order and grouping (`checks.numerics.pairwise_sums`), over N: both
    reductions divide by powers of two only, which is exact. A parameter a rank's backward does not reach adds a
    zero term there, and a missing gradient compares as zeros: the collectives issued here are the same on every
    rank whatever each one reached. Reported: the elements of FSDP's and of DDP's gradient outside that set, the
    parameters bitwise equal between the two, the worst distance in ulps, and which trained parameter, reached
    on some rank, has no gradient on a side (or which frozen one has one).

    Where the strategy's gradient is not DDP's bit for bit: how far apart (the largest absolute and relative
    difference, and ulps), and the same comparison rerun in float64 (``float64`` builds a fresh DDP reference
    and strategy from the same weights in float64). Two fp32 results of the same sums added in other orders
    differ by rounding, which float64 makes about 2^29 times smaller; different values stay as far apart."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from checks.numerics import pairwise_sums

    loss_of(forward(local.to(ctx.device), make_batch, ctx, 0)).backward()
    params = dict((clean(n), p) for n, p in local.named_parameters())
    names = [n for n, p in params.items() if p.requires_grad]  # the same on every rank
    mine = torch.cat([_or_zeros(params[n].grad, params[n]).reshape(-1) for n in names])
    terms = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(terms, mine)
    allowed = [total / ctx.world_size for total in pairwise_sums(terms)]
    ddp = DDP(reference.to(ctx.device), find_unused_parameters=bool(reach.unreached()))
    loss_of(forward(ddp, make_batch, ctx, 0)).backward()
    want = {clean(n): p.grad.detach().clone() for n, p in ddp.module.named_parameters() if p.grad is not None}
    grads: dict[str, torch.Tensor] = {}
    if sharded is not None:
        module = sharded if isinstance(sharded, nn.Module) else sharded.model  # a reference ZeRO stage's model
        loss_of(forward(module, make_batch, ctx, 0)).backward()
        grads = _whole_grads(sharded)
    reached = reach.anywhere("grads")
    sides = (("sharded", grads), ("ddp", want)) if sharded is not None else (("ddp", want),)
    missing = sorted({n for _, values in sides for n in names if n in reached and n not in values}
                     | {n for _, values in sides for n in values if n not in names})  # fmt: skip
    outside = {}
    if not missing:
        for label, values in sides:
            flat = torch.cat([_or_zeros(values.get(n), params[n]).reshape(-1) for n in names])
            inside = torch.zeros_like(flat, dtype=torch.bool)
            for candidate in allowed:
                inside |= flat == candidate
            outside[label] = int((~inside).sum())
    distances = {n: _ulps(_or_zeros(grads.get(n), params[n]), _or_zeros(want.get(n), params[n])) for n in names}
    worst = max(distances, key=lambda n: distances[n]) if distances and sharded is not None else None
    apart = _apart(grads, want, names, params) if sharded is not None and not missing else None
    if apart is not None and apart["elements"] and float64 is not None:
        apart["float64"] = _float64_apart(ctx, make_batch, float64, names, reach)
    return {
        "apart": apart,
        "parameters": len(distances) if sharded is not None else 0,
        "elements": int(mine.numel()),
        "sums": len(allowed),
        "outside": outside,
        "bitwise": sum(d == 0 for d in distances.values()) if sharded is not None else 0,
        "worst_ulps": distances[worst] if worst else 0,
        "worst_parameter": worst if worst and distances[worst] else None,
        "missing": missing,
    }


def _apart(grads: dict[str, torch.Tensor], want: dict[str, torch.Tensor], names: list[str],
           params: dict[str, torch.Tensor]) -> dict[str, Any]:  # fmt: skip
    """How far the strategy's gradient is from DDP's: differing elements, the largest absolute difference and
    its parameter, and the largest difference relative to its parameter's largest DDP gradient, also in fp32
    units in the last place of that largest gradient (a relative error that near-zero elements do not blow up)."""
    elements, largest, relative, where = 0, 0.0, 0.0, None
    for name in names:
        a, b = _or_zeros(grads.get(name), params[name]).double(), _or_zeros(want.get(name), params[name]).double()
        diff = (a - b).abs()
        elements += int((diff > 0).sum())
        if not diff.numel() or not float(diff.max()):
            continue
        if float(diff.max()) > largest:
            largest, where = float(diff.max()), name
        scale = float(b.abs().max())
        relative = max(relative, float(diff.max()) / scale if scale else math.inf)
    ulps = relative * 2**23 if math.isfinite(relative) else math.inf  # an fp32 ulp is 2^-23 of [2^e, 2^(e+1))
    return {"elements": elements, "max_abs": largest, "max_rel": relative, "ulps": ulps, "parameter": where,
            "float64": None}  # fmt: skip


def _float64_apart(ctx: RankContext, make_batch: Callable[[], Any], build: Callable[[], tuple[nn.Module, Any]],
                   names: list[str], reach: Reach) -> float:  # fmt: skip
    """The largest absolute difference between the strategy's gradient and DDP's, both in float64 (every rank
    runs this: the strategy's gradient is gathered with collectives)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    local, sharded = build()
    ddp = DDP(local.to(ctx.device), find_unused_parameters=bool(reach.unreached()))
    loss_of(forward(ddp, make_batch, ctx, 0, torch.float64)).backward()
    want = {clean(n): p.grad for n, p in ddp.module.named_parameters() if p.grad is not None}
    module = sharded if isinstance(sharded, nn.Module) else sharded.model
    loss_of(forward(module, make_batch, ctx, 0, torch.float64)).backward()
    grads = _whole_grads(sharded)
    params = dict((clean(n), p) for n, p in ddp.module.named_parameters())
    return max(float((_or_zeros(grads.get(n), params[n]) - _or_zeros(want.get(n), params[n])).abs().max())
               for n in names)  # fmt: skip


def _or_zeros(grad: torch.Tensor | None, param: torch.Tensor) -> torch.Tensor:
    return grad.detach() if grad is not None else torch.zeros(param.shape, dtype=param.dtype, device=param.device)


def _whole_grads(model: Any) -> dict[str, torch.Tensor]:
    if not isinstance(model, nn.Module):  # a reference ZeRO stage: its shards gathered (a collective)
        return {clean(n): g for n, g in model.full_grads().items()}
    if hasattr(model, "reducer"):  # DDP (under ZeroRedundancyOptimizer): whole gradients on every rank
        return {clean(n): p.grad.detach().clone() for n, p in model.module.named_parameters() if p.grad is not None}
    if hasattr(model, "_exec_order_data"):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        # Inside the summon every view of a flat gradient has one, a frozen parameter's too; training's views
        # (`_use_sharded_grad_views`) give those None, so they are left out here
        trained = {clean(n) for n, p in model.named_parameters() if p.requires_grad}
        with FSDP.summon_full_params(model, writeback=False, with_grads=True):
            return {clean(n): p.grad.detach().clone() for n, p in model.named_parameters()
                    if p.grad is not None and clean(n) in trained}  # fmt: skip
    return {clean(n): p.grad.full_tensor().detach().clone() for n, p in model.named_parameters() if p.grad is not None}
