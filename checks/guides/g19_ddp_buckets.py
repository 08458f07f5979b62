"""Checks for guide 19, DDP's gradient buckets: their capacities, the one bucket of iteration 1, the rebuild after
it, when each bucket's all-reduce is issued, ``no_sync``, ``gradient_as_bucket_view``, comm hooks, and replicas
that stay identical.

DDP's buckets are read from its reducer (``reducer._get_zeros_like_grad_buckets()``: one `GradBucket` per bucket,
its parameters in bucket order), its collectives at the dispatcher (`checks.probes.comm.record_comm`, where DDP's
C++ all-reduces and the rebuild's broadcasts appear), and the moment each gradient is ready from a
post-accumulate-grad hook per parameter on the same clock (`checks.probes.grad_ready`). Expected layouts come from
the torch-free model `checks.models.ddp_buckets`, fed only the parameters' sizes, the settings and the
gradient-ready order our own hooks saw; the numbers the guide states come from its expect blocks; expected
gradients from the ranks' local gradients (an unwrapped replica's, gathered) and fp32 or fp16 arithmetic.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from checks.breakit.exercises import Exercise
from checks.breakit.patches import wrapping
from checks.models import ddp_buckets as db
from checks.numerics import pairwise_sums
from checks.probes.comm import CommLog, record_comm
from checks.probes.event_log import EventLog
from checks.probes.grad_ready import ready_order, record_grad_ready
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.gpt import batch
from checks.workloads.toy import wrap_ddp
from mini_gpt import GPT, preset

LINEAR_WIDTH, LINEAR_DEPTH = 256, 6  # six Linear(256, 256): 1,579,008 bytes, across the 1 MiB first bucket
LR = 1e-3
HOOKS_MODULE = "torch.distributed.algorithms.ddp_comm_hooks.default_hooks"
FP16_UNIT_ROUNDOFF = 2.0**-11  # fp16 keeps 11 significant bits: rounding to nearest errs by at most 2^-11, relative
FP16_HALF_SUBNORMAL = 2.0**-25  # below 2^-14 fp16 is subnormal, spaced 2^-24: rounding errs by at most 2^-25


# -- workloads ----------------------------------------------------------------------------------------------------
def linears(device: torch.device | str = "cpu", seed: int = 0) -> nn.Sequential:
    """Six Linear(256, 256), weights from ``seed`` alone: twelve parameters, 394,752 elements."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(*(nn.Linear(LINEAR_WIDTH, LINEAR_WIDTH) for _ in range(LINEAR_DEPTH)))
    return model.to(device)


class RankOrderedBranches(nn.Module):
    """Two Linear(8, 8) branches summed. Rank 0 runs ``a`` first, every other rank ``b``: autograd runs the later
    branch's backward first, so rank 0's gradients become ready in another order than the other ranks'."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second = (self.a, self.b) if dist.get_rank() == 0 else (self.b, self.a)
        done = first(x).sum()
        return done + second(x).sum()


def _model(ctx: RankContext, workload: str) -> nn.Module:
    """``linears``, or a mini_gpt preset (``tiny``, ``grammar``) with its deterministic init."""
    if workload == "linears":
        return linears(ctx.device)
    return GPT(preset(workload), seed=0).to(ctx.device)


def _loss(model: nn.Module, ctx: RankContext, workload: str, step: int) -> torch.Tensor:
    """This rank's loss on its own inputs of ``step`` (different on every rank and step)."""
    if workload == "linears":
        generator = torch.Generator().manual_seed(97 * step + ctx.rank)
        return model(torch.randn(4, LINEAR_WIDTH, generator=generator).to(ctx.device)).sum()
    _, loss = model(*batch(ctx, step=step, preset_name=workload))
    return loss


def _ddp(ctx: RankContext, workload: str, **options: Any) -> nn.Module:
    return wrap_ddp(_model(ctx, workload), ctx, **options)


def _params(ddp: nn.Module) -> list[db.Param]:
    """What the bucket model reads of each parameter, in DDP's order (``module.parameters()``: registration
    order, a tied weight once)."""
    return [db.Param(p.numel(), p.element_size(), str(p.dtype).removeprefix("torch.")) for p in ddp.module.parameters()]


def _names(ddp: nn.Module) -> list[str]:
    return [name for name, _ in ddp.module.named_parameters()]


LAST_BUCKET_CAP = "DDP_SET_LAST_BUCKET_CAP"  # read by the reducer's C++ rebuild; "1" (exactly) moves the small cap last


def _options(options: dict[str, Any], env: dict[str, str] | None = None) -> db.Options:
    cap_list = options.get("bucket_cap_mb_list")
    return db.Options(
        bucket_cap_mb=options.get("bucket_cap_mb"),
        bucket_cap_mb_list=tuple(cap_list) if cap_list else None,
        find_unused_parameters=options.get("find_unused_parameters", False),
        static_graph=options.get("static_graph", False),
        last_bucket_cap=(env or {}).get(LAST_BUCKET_CAP) == "1",
    )


@contextlib.contextmanager
def environment(env: dict[str, str] | None) -> Iterator[None]:
    """``env`` set in this rank's environment (which the reducer's C++ reads), the old values restored after, so
    no other check in the pool sees it."""
    saved = {name: os.environ.get(name) for name in env or {}}
    os.environ.update(env or {})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def reducer_buckets(ddp: nn.Module) -> list[list[int]]:
    """The reducer's buckets in its order, each as parameter indices in bucket order."""
    index = {id(p): i for i, p in enumerate(ddp.module.parameters())}
    return [[index[id(p)] for p in bucket.parameters()] for bucket in ddp.reducer._get_zeros_like_grad_buckets()]


# -- running iterations -------------------------------------------------------------------------------------------
@dataclass
class Trace:
    """What some iterations did: buckets before each forward and after each backward, each iteration's
    collectives, whether the buckets had been rebuilt after it, and every forward and ready gradient."""

    before: list[list[list[int]]] = field(default_factory=list)
    after: list[list[list[int]]] = field(default_factory=list)
    comm: list[CommLog] = field(default_factory=list)
    rebuilt: list[bool] = field(default_factory=list)
    ready: EventLog = field(default_factory=EventLog)

    def bucket_reduces(self, iteration: int) -> list[Any]:
        """Iteration's all-reduces issued in backward, in issue order (buckets, then any used-parameter map)."""
        return self.comm[iteration - 1].select("all_reduce", in_backward=True)

    def forward_collectives(self, iteration: int) -> list[Any]:
        return [c for c in self.comm[iteration - 1] if not c.in_backward]


def run_iterations(ddp: nn.Module, ctx: RankContext, workload: str, iterations: int) -> Trace:
    """Forward and backward ``iterations`` times (gradients zeroed in between; parameters never change)."""
    trace = Trace()
    with record_grad_ready(ddp) as ready:
        for step in range(iterations):
            trace.before.append(reducer_buckets(ddp))
            with record_comm() as comm:
                _loss(ddp, ctx, workload, step).backward()
            trace.after.append(reducer_buckets(ddp))
            trace.comm.append(comm)
            trace.rebuilt.append(bool(ddp._has_rebuilt_buckets))
            ddp.zero_grad(set_to_none=True)
    trace.ready = ready
    return trace


def _numbers(params: list[db.Param], buckets_per_iteration: list[list[list[int]]]) -> list[str]:
    """The guide's way of writing a layout: ``iteration 2: 263168 131584`` (elements per bucket, in order)."""
    return [f"iteration {i}: " + " ".join(str(n) for n in db.bucket_numels(params, buckets))
            for i, buckets in enumerate(buckets_per_iteration, start=1)]  # fmt: skip


# -- claims: the buckets of every iteration against the model -------------------------------------------------------
def buckets_match_model(ctx: RankContext, workload: str, expected: list[str], options: dict[str, Any] | None = None,
                        iterations: int = 3, *, env: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """In every iteration the reducer's buckets are the model's (from the parameters' sizes, the settings, ``env``
    and the gradient-ready order our hooks saw); the backward all-reduces one bucket each, in bucket order, plus the
    used-parameter map where the model says; the rebuild's forward broadcasts P + 1 and B int32 from
    ``_pre_forward`` and no other forward communicates. The elements per bucket are the guide's (``expected``).
    ``env`` is set in the ranks' environment from construction to the last backward, then restored."""
    options = options or {}
    with environment(env):
        ddp = _ddp(ctx, workload, **options)
        trace = run_iterations(ddp, ctx, workload, iterations)
    params = _params(ddp)
    orders = [ready_order(trace.ready, i) for i in range(1, iterations + 1)]
    require(all(order == orders[0] for order in orders), "ready-order-changed", "gradients became ready in a "
            "different order in some iteration: the model assumes one order", orders=orders)  # fmt: skip
    plan = db.plan(params, orders[0], _options(options, env), iterations)
    for i, (step, buckets) in enumerate(zip(plan, trace.after, strict=True), start=1):
        require_equal(buckets, step.buckets, reason="buckets-differ-from-model", what=f"iteration {i}: buckets",
                      iteration=i)  # fmt: skip
        reduces = [(c.numel, c.dtype.removeprefix("torch.")) for c in trace.bucket_reduces(i)]
        require_equal(reduces, step.all_reduces, reason="all-reduces-differ-from-model",
                      what=f"iteration {i}: all-reduces (elements, dtype)", iteration=i)  # fmt: skip
        _require_rebuild_broadcasts(trace.forward_collectives(i), step.broadcasts, i)
    observed = _numbers(params, trace.after)
    require_equal(observed, expected, reason="numbers-differ-from-guide", what="elements per bucket")
    return {
        "buckets": observed,
        "bucket_count": [len(b) for b in trace.after],
        "layouts": trace.after,
        "ready_order": [_names(ddp)[i] for i in orders[0]],
        "broadcasts": [[c.numel for c in trace.forward_collectives(i)] for i in range(1, iterations + 1)],
        "all_reduces": [[c.numel for c in trace.bucket_reduces(i)] for i in range(1, iterations + 1)],
    }


def _require_rebuild_broadcasts(collectives: list[Any], expected: list[int], iteration: int) -> None:
    observed = [(c.op, c.numel, c.dtype, c.caller.rsplit(":", 1)[-1]) for c in collectives]
    want = [("broadcast", n, "torch.int32", "DistributedDataParallel._pre_forward") for n in expected]
    require_equal(observed, want, reason="broadcasts-differ-from-model",
                  what=f"iteration {iteration}: collectives in forward (op, elements, dtype, caller)",
                  iteration=iteration)  # fmt: skip


# -- claims: the rebuild ------------------------------------------------------------------------------------------
def rebuild_reorders(ctx: RankContext, ready: list[str], broadcasts: list[str]) -> dict[str, Any]:
    """Until the second forward the one bucket holds the parameters in registration order; that forward's
    ``_rebuild_buckets()`` returns True once and leaves the buckets in the order the first backward made the
    gradients ready (the guide's ``ready``), after broadcasting the guide's ``broadcasts``; no other forward
    broadcasts. Where the ranks' orders differ, every rank takes rank 0's (`_rebuild_takes_rank_0s`)."""
    ddp = _ddp(ctx, "linears")
    trace = run_iterations(ddp, ctx, "linears", 3)
    names = _names(ddp)
    first_ready = ready_order(trace.ready, 1)
    registration = list(range(len(names)))
    require_equal(_flat(trace.before[1]), registration, reason="not-registration-order",
                  what="the buckets before the second forward, flattened")  # fmt: skip
    require_equal(trace.rebuilt, [False, True, True], reason="rebuild-flag",
                  what="`_has_rebuilt_buckets` after each iteration")  # fmt: skip
    require_equal(_flat(trace.after[1]), first_ready, reason="not-gradient-ready-order",
                  what="the rebuilt buckets, flattened, against iteration 1's gradient-ready order",
                  buckets=trace.after[1])  # fmt: skip
    said = [f"broadcast {c.numel} {c.dtype.removeprefix('torch.')}" for c in trace.forward_collectives(2)]
    require_equal(said, broadcasts, reason="rebuild-broadcasts", what="the second forward's collectives")
    others = [c.describe() for i in (1, 3) for c in trace.forward_collectives(i)]
    require_equal(others, [], reason="rebuild-broadcasts", what="collectives in the first and third forwards")
    order = [names[i] for i in first_ready]
    require_equal(order, ready, reason="ready-order-differs-from-guide", what="iteration 1's gradient-ready order")
    source = _rebuild_takes_rank_0s(ctx)
    return {
        "from_rank_0": source,
        "before": [[names[i] for i in b] for b in trace.before[1]],
        "after": [[names[i] for i in b] for b in trace.after[1]],
        "first_bucket": [names[i] for i in trace.after[1][0]],
        "ready_order": order,
        "broadcasts": said,
        "broadcast_elements": [c.numel for c in trace.forward_collectives(2)],
        "broadcast_bytes": sum(c.nbytes for c in trace.forward_collectives(2)),
    }


def _rebuild_takes_rank_0s(ctx: RankContext) -> dict[str, Any]:
    """The rebuild's broadcasts come from rank 0: on `RankOrderedBranches`, whose ranks make their gradients ready in
    different orders in the first backward, every rank's rebuilt buckets, flattened, are rank 0's order."""
    ddp = wrap_ddp(RankOrderedBranches().to(ctx.device), ctx)
    with record_grad_ready(ddp) as ready:
        for step in range(2):
            generator = torch.Generator().manual_seed(97 * step + ctx.rank)
            ddp(torch.randn(2, 8, generator=generator).to(ctx.device)).backward()
            ddp.zero_grad(set_to_none=True)
    orders = ctx.gather(ready_order(ready, 1))
    require(any(order != orders[0] for order in orders[1:]), "ready-orders-agree", "every rank made its gradients "
            "ready in rank 0's order: which rank the layout came from cannot be seen", orders=orders)  # fmt: skip
    layouts = ctx.gather(_flat(reducer_buckets(ddp)))
    require_equal(layouts, [orders[0]] * ctx.world_size, reason="not-rank-0s-layout",
                  what="every rank's rebuilt buckets, flattened, against rank 0's gradient-ready order",
                  orders=orders)  # fmt: skip
    return {"ready_orders": orders, "layouts": layouts}


def _flat(buckets: list[list[int]]) -> list[int]:
    return [i for bucket in buckets for i in bucket]


# -- claims: when each all-reduce is issued -----------------------------------------------------------------------
def issue_order(ctx: RankContext, workload: str, expected: list[str], ends: list[str] | None = None, *,
                options: dict[str, Any] | None = None, iterations: int = 3) -> dict[str, Any]:  # fmt: skip
    """Each bucket's all-reduce is issued as soon as its last gradient is ready: the gradients ready before
    bucket k's all-reduce are exactly buckets 0..k's. So with two buckets or more, bucket 0's all-reduce comes
    before the last gradient of the step; with one (iteration 1 by default), after all of them. ``expected``:
    the guide's lines, one per iteration; ``ends``: its first and last gradient to be ready."""
    options = options or {}
    ddp = _ddp(ctx, workload, **options)
    trace = run_iterations(ddp, ctx, workload, iterations)
    names = _names(ddp)
    lines, to_come = [], []
    for i in range(1, iterations + 1):
        ready = [(e.seq, int(e.target or -1)) for e in trace.ready.select("post_backward", iteration=i)]
        buckets = trace.after[i - 1]
        reduces = [c for c in trace.bucket_reduces(i) if c.dtype != "torch.int32"]  # not a used-parameter map
        for k, reduce in enumerate(reduces):
            before = sorted(index for seq, index in ready if seq < reduce.seq)
            require_equal(before, sorted(_flat(buckets[: k + 1])), reason="not-issued-when-bucket-ready",
                          what=f"iteration {i}: gradients ready before bucket {k}'s all-reduce", iteration=i,
                          bucket=k)  # fmt: skip
        still = sum(1 for seq, _ in ready if seq > reduces[0].seq)
        to_come.append(still)
        if len(buckets) == 1:
            lines.append(f"iteration {i}: 1 all-reduce, after all {len(ready)} gradients")
        else:
            lines.append(f"iteration {i}: {len(buckets)} all-reduces, bucket 0's with {still} of {len(ready)} "
                         "gradients to come")  # fmt: skip
    rebuild_at = db.rebuild_iteration(_options(options))  # None: the caps apply from iteration 1
    if rebuild_at is not None:
        require(to_come[0] == 0, "overlap-in-iteration-1", f"bucket 0 was all-reduced with {to_come[0]} gradients "
                "still to come in iteration 1, where DDP has one bucket", observed=to_come[0])  # fmt: skip
    # From the rebuild on the claim's model (larger than the first bucket) must overlap.
    late = [i for i in range(rebuild_at or 1, iterations + 1) if to_come[i - 1] == 0]
    require(not late, "no-overlap", f"iterations {late}: nothing was all-reduced before the last gradient",
            iterations=late, to_come=to_come)  # fmt: skip
    require_equal(lines, expected, reason="issue-order-differs-from-guide", what="the issue order per iteration")
    order = ready_order(trace.ready, iterations)
    first_and_last = [f"first ready: {names[order[0]]}", f"last ready: {names[order[-1]]}"]
    if ends is not None:
        require_equal(first_and_last, ends, reason="ready-ends-differ-from-guide", what="the first and last gradient")
    final = trace.after[-1]
    return {
        "lines": lines,
        "to_come": to_come,
        "first_bucket": [names[i] for i in final[0]],
        "last_bucket": [names[i] for i in final[-1]],
        "ready_ends": first_and_last,
    }


# -- claims: no_sync ----------------------------------------------------------------------------------------------
def no_sync_accumulates(ctx: RankContext, micro_steps: int = 3, rounds: int = 2,
                        bucket_cap_mb: float = 0.05) -> dict[str, Any]:  # fmt: skip
    """``rounds`` rounds of ``micro_steps`` micro-batches on mini_gpt tiny, all but the last inside ``no_sync``:
    no micro-step inside it all-reduces; the last one all-reduces one bucket each, and leaves every rank the mean
    over ranks of its accumulated local gradients (an unwrapped replica's, gathered), exactly: at N=2 the one fp32
    value, at N=4 one of the pairwise summation orders. The rebuild's broadcasts, due after round 1, come in the
    first forward of round 2, inside ``no_sync``, and no other micro-step broadcasts."""
    ddp = _ddp(ctx, "tiny", bucket_cap_mb=bucket_cap_mb)
    replica = _model(ctx, "tiny")
    optim = torch.optim.AdamW(ddp.parameters(), lr=LR)
    report: list[dict[str, Any]] = []
    for r in range(rounds):
        replica.load_state_dict(ddp.module.state_dict())
        replica.zero_grad(set_to_none=True)
        optim.zero_grad(set_to_none=True)
        collectives = []
        for m in range(micro_steps):
            step = r * micro_steps + m
            synced = m == micro_steps - 1
            accumulate = contextlib.nullcontext() if synced else ddp.no_sync()
            with record_comm() as comm, accumulate:
                _loss(ddp, ctx, "tiny", step).backward()
            _loss(replica, ctx, "tiny", step).backward()
            collectives.append([(c.op, c.numel) for c in comm])
        buckets = reducer_buckets(ddp)
        inside = [c for micro in collectives[:-1] for c in micro if c[0] != "broadcast"]
        require_equal(inside, [], reason="all-reduce-inside-no-sync", what=f"round {r + 1}: collectives inside "
                      "no_sync, besides the rebuild's broadcasts", round=r + 1)  # fmt: skip
        synced_reduces = [n for op, n in collectives[-1] if op == "all_reduce"]
        expected_reduces = db.bucket_numels(_params(ddp), buckets)
        require_equal(synced_reduces, expected_reduces, reason="synced-step-all-reduces",
                      what=f"round {r + 1}: the synced micro-step's all-reduces (elements)", round=r + 1)  # fmt: skip
        _require_mean_of_local(ctx, ddp, replica, r + 1)
        broadcasts = [[n for op, n in micro if op == "broadcast"] for micro in collectives]
        # The rebuild is due once round 1's synced backward recorded the ready order: round 2's first forward.
        rebuild = [len(_params(ddp)) + 1, len(buckets)] if r == 1 else []
        require_equal(broadcasts, [rebuild] + [[]] * (micro_steps - 1), reason="rebuild-broadcasts",
                      what=f"round {r + 1}: broadcasts per micro-step (elements)", round=r + 1)  # fmt: skip
        report.append({"collectives": collectives, "buckets": len(buckets), "broadcasts": broadcasts})
        optim.step()
    return {"rounds": report, "inside_no_sync": [[m for m in rnd["collectives"][:-1]] for rnd in report]}


def _require_mean_of_local(ctx: RankContext, ddp: nn.Module, replica: nn.Module, round_: int) -> None:
    """Every gradient element times N is a sum, in some pairwise order, of the ranks' local accumulations."""
    local = torch.cat([p.grad.detach().flatten() for p in replica.parameters()]).cpu()
    everyone = [torch.empty_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(everyone, local)
    reduced = torch.cat([p.grad.detach().flatten() for p in ddp.module.parameters()]).cpu()
    sums = torch.stack(pairwise_sums(everyone))
    unexplained = int((~(sums == reduced * ctx.world_size).any(dim=0)).sum())
    worst = float((reduced - sums[0] / ctx.world_size).abs().max())
    require(unexplained == 0, "not-the-whole-batch-gradient", f"round {round_}: {unexplained} gradient elements are "
            "not the mean of the ranks' accumulated gradients", round=round_, observed=unexplained,
            max_abs_diff=worst)  # fmt: skip


# -- claims: gradient_as_bucket_view ------------------------------------------------------------------------------
def grads_view_buckets(ctx: RankContext, expected: list[str], iterations: int = 3) -> dict[str, Any]:
    """After a steady step with ``gradient_as_bucket_view=True`` every gradient is a view into the storage its
    bucket's all-reduce moved, at the model's offset; without it no gradient shares a storage with a bucket. The
    distinct bytes of gradients and buckets are then 4|θ| and 2·4|θ|: the guide's numbers (``expected``)."""
    totals, report = [], {}
    for view in (True, False):
        ddp = _ddp(ctx, "linears", gradient_as_bucket_view=view)
        for step in range(iterations):
            ddp.zero_grad(set_to_none=True)
            with record_comm() as comm:
                _loss(ddp, ctx, "linears", step).backward()
        params, buckets = _params(ddp), reducer_buckets(ddp)
        grads = [p.grad for p in ddp.module.parameters()]
        reduces = comm.select("all_reduce")
        held = {g.untyped_storage().data_ptr(): g.untyped_storage().nbytes() for g in grads}
        bucket_storages = {c.storages[0]: c.nbytes for c in reduces}
        if view:
            for k, (bucket, reduce) in enumerate(zip(buckets, reduces, strict=True)):
                where = [(grads[i].untyped_storage().data_ptr(), grads[i].storage_offset()) for i in bucket]
                want = [(reduce.storages[0], offset) for offset in db.view_offsets(params, bucket)]
                require_equal(where, want, reason="gradient-not-a-bucket-view", what=f"bucket {k}: (storage, "
                              "offset) of each gradient against its all-reduce's storage", bucket=k)  # fmt: skip
        else:
            shared = sorted(set(held) & set(bucket_storages))
            require_equal(shared, [], reason="gradient-is-a-bucket-view",
                          what="storages both a gradient and an all-reduced bucket hold")  # fmt: skip
        total = sum({**held, **bucket_storages}.values())
        totals.append(f"{'with' if view else 'without'} gradient_as_bucket_view: {total} bytes")
        report["with" if view else "without"] = {"bytes": total, "grad_storages": len(held),
                                                 "buckets": len(bucket_storages)}  # fmt: skip
    gradient_bytes = sum(p.nbytes for p in _params(ddp))
    saved = report["without"]["bytes"] - report["with"]["bytes"]
    require(saved == gradient_bytes, "saving-not-the-gradients", f"gradient_as_bucket_view saves {saved} bytes, the "
            f"gradients are {gradient_bytes}", observed=saved, expected=gradient_bytes)  # fmt: skip
    require_equal(totals, expected, reason="bytes-differ-from-guide", what="distinct bytes of gradients and buckets")
    return {**report, "saved": saved, "lines": totals}


# -- claims: communication hooks -----------------------------------------------------------------------------------
def _default_hooks() -> Any:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks


def _grads(ddp: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.detach().flatten() for p in ddp.module.parameters()]).cpu()


def _parameters(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()


def allreduce_hook_is_builtin(ctx: RankContext, steps: int = 3, bucket_cap_mb: float = 0.05) -> dict[str, Any]:
    """DDP with ``register_comm_hook(None, allreduce_hook)`` against DDP without: the same all-reduces (count,
    elements, dtype), issued from the hook's Python (``_allreduce_fut``) instead of C++, and gradients and AdamW
    parameters bitwise equal after every step."""
    plain = _ddp(ctx, "tiny", bucket_cap_mb=bucket_cap_mb)
    hooked = _ddp(ctx, "tiny", bucket_cap_mb=bucket_cap_mb)
    hooked.register_comm_hook(None, _default_hooks().allreduce_hook)
    optims = [torch.optim.AdamW(m.parameters(), lr=LR) for m in (plain, hooked)]
    callers: set[tuple[str, str]] = set()
    counts = []
    for step in range(steps):
        logs = []
        for model in (plain, hooked):
            with record_comm() as comm:
                _loss(model, ctx, "tiny", step).backward()
            logs.append(comm)
        shapes = [[(c.op, c.numel, c.dtype) for c in log] for log in logs]
        require_equal(shapes[1], shapes[0], reason="hook-collectives-differ", what=f"step {step + 1}: the hooked "
                      "DDP's collectives (op, elements, dtype) against the built-in's", step=step + 1)  # fmt: skip
        callers |= {(c.api, c.caller) for c in logs[1].select("all_reduce")}
        require({c.api for c in logs[0].select("all_reduce")} == {"<C++>"}, "builtin-not-cpp",
                "the built-in all-reduce was issued from Python", step=step + 1)  # fmt: skip
        differing = int((_grads(plain) != _grads(hooked)).sum())
        require(differing == 0, "hook-gradients-differ", f"step {step + 1}: {differing} gradient elements differ "
                "from the built-in all-reduce's", step=step + 1, observed=differing)  # fmt: skip
        for optim in optims:
            optim.step()
            optim.zero_grad(set_to_none=True)
        require(torch.equal(_parameters(plain), _parameters(hooked)), "hook-parameters-differ",
                f"after step {step + 1} the parameters differ", step=step + 1)  # fmt: skip
        counts.append(len(logs[1].select("all_reduce")))
    expected_caller = {("all_reduce", f"{HOOKS_MODULE}:_allreduce_fut")}
    require_equal(callers, expected_caller, reason="hook-not-called", what="(api, caller) of the hooked all-reduces")
    return {"all_reduces_per_step": counts, "callers": sorted(callers)}


def fp16_error_bound(ctx: RankContext, steps: int = 3, slack: float = 1.01, tight: float = 0.5) -> dict[str, Any]:
    """``fp16_compress_hook`` against the fp32 built-in, at the same parameters every step (mini_gpt tiny, one
    bucket): every element of the compressed gradient is within B = slack · (N · 2^-11 · mean_r |a_r| + (N+1) ·
    2^-25) of the fp32 one, a_r the ranks' local gradients (the guide derives it); the all-reduces carry fp16; and
    the worst element reaches at least ``tight`` of B, so the bound is not loose and the rounding did happen."""
    n = ctx.world_size
    fp32 = _ddp(ctx, "tiny")
    fp16 = _ddp(ctx, "tiny")
    fp16.register_comm_hook(None, _default_hooks().fp16_compress_hook)
    replica = _model(ctx, "tiny")
    optim = torch.optim.AdamW(fp16.parameters(), lr=LR)
    worst_ratio, worst_relative, dtypes = 0.0, 0.0, set()
    for step in range(steps):
        fp32.module.load_state_dict(fp16.module.state_dict())
        replica.load_state_dict(fp16.module.state_dict())
        with record_comm() as comm:
            _loss(fp16, ctx, "tiny", step).backward()
        _loss(fp32, ctx, "tiny", step).backward()
        _loss(replica, ctx, "tiny", step).backward()
        local = torch.cat([p.grad.detach().flatten() for p in replica.parameters()]).cpu()
        everyone = [torch.empty_like(local) for _ in range(n)]
        dist.all_gather(everyone, local)
        mean_abs = torch.stack(everyone).double().abs().mean(dim=0)
        bound = slack * (n * FP16_UNIT_ROUNDOFF * mean_abs + (n + 1) * FP16_HALF_SUBNORMAL)
        reference = _grads(fp32).double()
        error = (_grads(fp16).double() - reference).abs()
        ratio = error / bound
        at = int(ratio.argmax())
        require(bool((error <= bound).all()), "beyond-fp16-bound", f"step {step + 1}: element {at} is off by "
                f"{float(error[at]):.3g}, {float(ratio[at]):.3g} of its bound {float(bound[at]):.3g}", step=step + 1,
                ratio=float(ratio[at]), error=float(error[at]), bound=float(bound[at]),
                elements_beyond=int((error > bound).sum()))  # fmt: skip
        dtypes |= {(c.dtype, c.nbytes == 2 * c.numel) for c in comm.select("all_reduce")}
        worst_ratio = max(worst_ratio, float(ratio[at]))
        worst_relative = max(worst_relative, float(error.max() / reference.abs().max()))
        optim.step()
        for model in (fp16, fp32, replica):
            model.zero_grad(set_to_none=True)
    require_equal(dtypes, {("torch.float16", True)}, reason="not-fp16", what="(dtype, 2 bytes per element) of the "
                  "hooked all-reduces")  # fmt: skip
    require(worst_ratio >= tight, "bound-not-tight", f"the worst element reached only {worst_ratio:.3g} of its bound",
            observed=worst_ratio, expected=tight)  # fmt: skip
    return {"worst_ratio": worst_ratio, "worst_relative_to_largest": worst_relative}


# -- claims: the seeds' "they stay identical" ------------------------------------------------------------------------
def replicas_identical(ctx: RankContext, steps: int = 5) -> dict[str, Any]:
    """mini_gpt tiny under DDP and AdamW: after every step every rank's parameters are bitwise rank 0's."""
    ddp = _ddp(ctx, "tiny")
    optim = torch.optim.AdamW(ddp.parameters(), lr=LR)
    for step in range(steps):
        _loss(ddp, ctx, "tiny", step).backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        mine = _parameters(ddp.module)
        everyone = [torch.empty_like(mine) for _ in range(ctx.world_size)]
        dist.all_gather(everyone, mine)
        differing = {r: int((everyone[r] != everyone[0]).sum()) for r in range(1, ctx.world_size)}
        require(not any(differing.values()), "replicas-differ", f"after step {step + 1} ranks differ from rank 0 in "
                f"{differing} elements", step=step + 1, differing=differing)  # fmt: skip
    return {"steps": steps, "elements": int(mine.numel())}


# -- break-it recipes: DDP bent on purpose (tests/break_it/test_19_ddp_buckets.py applies them) ----------------------
def caps_from_the_start(original: Callable[..., Any], self: Any, **kwargs: Any) -> tuple[list[int], list[int]]:
    """``compute_bucket_size_limits`` that applies the caps (1 MiB, then the cap) in iteration 1 as well."""
    return [self.first_bucket_bytes_cap, self.bucket_bytes_cap], []


def no_limit_ever(original: Callable[..., Any], self: Any, **kwargs: Any) -> tuple[list[int], list[int]]:
    """``compute_bucket_size_limits`` that gives every bucketing, the rebuild's too, no limit: one bucket."""
    return [db.MAXSIZE], [db.MAXSIZE]


def rebuild_ignores_the_list(original: Callable[..., Any], self: Any, **kwargs: Any) -> tuple[list[int], list[int]]:
    """``compute_bucket_size_limits`` that keeps a ``bucket_cap_mb_list`` for iteration 1 only."""
    limits, _ = original(self, **kwargs)
    return limits, []


def limits_ignoring_find_unused(original: Callable[..., Any], self: Any, *, static_graph: bool,
                                find_unused_parameters: bool) -> tuple[list[int], list[int]]:  # fmt: skip
    """``compute_bucket_size_limits`` as if ``find_unused_parameters`` were False: one bucket in iteration 1."""
    return original(self, static_graph=static_graph, find_unused_parameters=False)


def explicit_default_cap(original: Callable[..., Any], *args: Any, bucket_cap_mb: Any = None, **kwargs: Any) -> Any:
    """``_BucketCapacityConfig.create`` with the default 25 passed explicitly: no 1 MiB first bucket."""
    return original(*args, bucket_cap_mb=25 if bucket_cap_mb is None else bucket_cap_mb, **kwargs)


def doubled_cap(original: Callable[..., Any], *args: Any, bucket_cap_mb: Any = None, **kwargs: Any) -> Any:
    """``_BucketCapacityConfig.create`` with twice the cap asked for."""
    return original(*args, bucket_cap_mb=None if bucket_cap_mb is None else 2 * bucket_cap_mb, **kwargs)


def one_bucket_per_parameter(original: Callable[..., Any], tensors: Any, *args: Any, **kwargs: Any) -> Any:
    """``dist._compute_bucket_assignment_by_size`` that puts every parameter in a bucket of its own."""
    _, limits = original(tensors, *args, **kwargs)
    return [[i] for i in range(len(tensors))], [limits[0]] * len(tensors)


def reducer_not_reversed(original: Callable[..., Any], params: Any, bucket_indices: Any, limits: Any,
                         *args: Any) -> Any:  # fmt: skip
    """``dist.Reducer`` given iteration 1's buckets in registration order, not reversed."""
    return original(params, list(reversed(bucket_indices)), list(reversed(limits)), *args)


class _NoRebuild:
    """A reducer whose ``_rebuild_buckets`` does nothing; everything else is the real one's."""

    def __init__(self, reducer: Any) -> None:
        self._reducer = reducer

    def _rebuild_buckets(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)


def pre_forward_without_rebuild(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """``DistributedDataParallel._pre_forward`` whose call of ``self.reducer._rebuild_buckets()`` does nothing."""
    reducer = self.reducer
    self.reducer = _NoRebuild(reducer)
    try:
        return original(self, *args, **kwargs)
    finally:
        self.reducer = reducer


def pre_forward_hiding(original: Callable[..., Any], self: Any, *args: Any, name: str, **kwargs: Any) -> Any:
    """``DistributedDataParallel._pre_forward`` run with the environment variable ``name`` unset, so the reducer's
    rebuild, called from it, does not see it; restored after."""
    saved = os.environ.pop(name, None)
    try:
        return original(self, *args, **kwargs)
    finally:
        if saved is not None:
            os.environ[name] = saved


_REVERSED_GROUPS = itertools.count()  # every rank builds them in the same order, so the names agree


def reversed_ranks_group() -> Any:
    """A gloo group of every rank in reverse: its group rank 0 is the last global rank. Built through c10d's helper
    (``new_group`` sorts the ranks it is given) and registered as ``new_group`` registers one."""
    c10d = dist.distributed_c10d
    ranks = list(range(dist.get_world_size() - 1, -1, -1))
    group, _ = c10d._new_process_group_helper(
        len(ranks), ranks.index(dist.get_rank()), ranks, "gloo", c10d._get_default_store(),
        f"g19-reversed-{next(_REVERSED_GROUPS)}", timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    c10d._world.pg_group_ranks[group] = {global_rank: i for i, global_rank in enumerate(ranks)}
    return group


def ddp_on_reversed_ranks(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> None:
    """``DistributedDataParallel.__init__`` on `reversed_ranks_group`: every broadcast DDP roots at its group's rank
    0, the rebuild's too, comes from the last global rank instead of rank 0."""
    original(self, *args, **{**kwargs, "process_group": reversed_ranks_group()})


def pre_forward_with_extra_broadcast(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """``_pre_forward`` that also broadcasts one int32 from rank 0 every forward."""
    dist.broadcast(torch.zeros(1, dtype=torch.int32), src=0)
    return original(self, *args, **kwargs)


def no_sync_that_syncs(original: Callable[..., Any], self: Any) -> Any:
    """``no_sync`` that changes nothing: every micro-step all-reduces."""
    return contextlib.nullcontext()


def no_sync_never_restored(original: Callable[..., Any], self: Any) -> Any:
    """``no_sync`` that turns synchronisation off for good: the synced micro-step all-reduces nothing."""
    self.require_backward_grad_sync = False
    return contextlib.nullcontext()


@contextlib.contextmanager
def no_sync_dropping_gradients(original: Callable[..., Any], self: Any) -> Iterator[None]:
    """``no_sync`` that zeroes what the micro-steps accumulated when it exits."""
    with original(self):
        yield
    for param in self.module.parameters():
        if param.grad is not None:
            param.grad.zero_()


def forced_bucket_view(original: Callable[..., Any], self: Any, *args: Any, value: bool, **kwargs: Any) -> None:
    """``DistributedDataParallel.__init__`` with ``gradient_as_bucket_view`` forced to ``value``."""
    original(self, *args, **{**kwargs, "gradient_as_bucket_view": value})


def allreduce_fut_undivided(original: Callable[..., Any], process_group: Any, tensor: torch.Tensor) -> Any:
    """The default hook's ``_allreduce_fut`` that sums without dividing by the world size."""
    group = process_group if process_group is not None else dist.group.WORLD
    return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(lambda fut: fut.value()[0])


def allreduce_fut_twice(original: Callable[..., Any], process_group: Any, tensor: torch.Tensor) -> Any:
    """``_allreduce_fut`` that all-reduces a copy of the bucket first, and drops it."""
    dist.all_reduce(tensor.clone())
    return original(process_group, tensor)


def compress_as(original: Callable[..., Any], dtype: Any, process_group: Any, bucket: Any, *, to: str) -> Any:
    """The default hooks' ``_compress_hook`` casting to ``to`` (``"bfloat16"``, ``"float32"``) instead."""
    return original(getattr(torch, to), process_group, bucket)


def _local_only(state, bucket):  # unannotated: DDP rejects any annotation but its own classes
    done: Any = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def _rank_skewed(state, bucket):  # unannotated: DDP rejects any annotation but its own classes
    buffer = bucket.buffer()
    dist.all_reduce(buffer.div_(dist.get_world_size()))
    buffer[0] += 1e-6 * dist.get_rank()
    done: Any = torch.futures.Future()
    done.set_result(buffer)
    return done


def ddp_with_hook(original: Callable[..., Any], self: Any, *args: Any, hook: str, **kwargs: Any) -> None:
    """``DistributedDataParallel.__init__`` followed by a comm hook: ``local`` all-reduces nothing (each rank keeps
    its own gradient), ``skewed`` all-reduces and then adds a rank-dependent 1e-6 to one element."""
    original(self, *args, **kwargs)
    self.register_comm_hook(None, {"local": _local_only, "skewed": _rank_skewed}[hook])


# -- exercises: some of these recipes as puzzles (``fsdp-readings exercise 19-ddp-buckets``) -------------------------
_DDP = "torch.nn.parallel.distributed:DistributedDataParallel"
_LIMITS = "torch.nn.parallel.distributed:_BucketCapacityConfig.compute_bucket_size_limits"

EXERCISES = (
    Exercise(
        "caps-from-the-start",
        claim="overlap-from-iteration-2",
        patches=(wrapping(_LIMITS, caps_from_the_start),),
        puzzle="`compute_bucket_size_limits` gives the first bucketing the caps (1 MiB, then 25 MiB) even without "
        "`find_unused_parameters`, as if registration order were the order gradients become ready.",
        reason="overlap-in-iteration-1",
    ),
    Exercise(
        "no-limit-ever",
        claim="overlap-from-iteration-2",
        patches=(wrapping(_LIMITS, no_limit_ever),),
        puzzle="`compute_bucket_size_limits` hands the reducer `sys.maxsize` for its rebuild too.",
        reason="no-overlap",
    ),
    Exercise(
        "no-sync-never-restored",
        claim="no-sync-accumulates",
        patches=(wrapping(f"{_DDP}.no_sync", no_sync_never_restored),),
        puzzle="`no_sync` sets `require_backward_grad_sync = False` and never puts it back.",
        reason="synced-step-all-reduces",
    ),
    Exercise(
        "hook-forgets-to-divide",
        claim="allreduce-hook-is-builtin",
        patches=(wrapping(f"{HOOKS_MODULE}:_allreduce_fut", allreduce_fut_undivided),),
        puzzle="The default hook's `_allreduce_fut` all-reduces the bucket without dividing it by the world size.",
        reason="hook-gradients-differ",
    ),
)
