"""Checks for guide 15, communication volume per training step: DDP, FSDP1 FULL_SHARD and SHARD_GRAD_OP, FSDP2
with and without the root resharded, and what gloo actually puts on the wire.

Every collective of a step is recorded at the dispatcher (`checks.probes.comm.record_comm`, witnessed by the
backend's own profiler events) and counted two ways, logical bytes and ring-model bytes. The expected values come
from the torch-free model `checks.models.comm_volume` over the model's parameter shapes, never from FSDP's state;
the ratios from its closed forms. Wire bytes are what the rank process passed to ``write`` system calls
(``/proc/self/io``: gloo's TCP transport on loopback), less a fixed header per call that the guide states.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from checks.expected import Expected
from checks.models import comm_volume as cv
from checks.naming import ROOT
from checks.probes.comm import CommLog, record_comm
from checks.ranks.context import RankContext
from checks.violation import Violation, require, require_equal
from checks.workloads.gpt import batch, fsdp1_gpt, tiny_shapes
from checks.workloads.toy import DEFAULT_UNITS, toy_batch, toy_model, train_step, wrap_ddp, wrap_fsdp1, wrap_fsdp2
from mini_gpt import GPT, preset

STEPS = 3  # DDP rebuilds its buckets at the start of step 2; step 3 is steady state for every strategy
BLOCKS = ("blocks.0", "blocks.1", "blocks.2")


# -- the parameter shapes the model is fed, built without torch's wrappers -----------------------------------------


def toy_shapes() -> dict[str, list[tuple[int, ...]]]:
    """The toy's shapes per unit: the root keeps child ``2``; ``0`` and ``1`` are units."""
    model = toy_model("meta")
    shapes: dict[str, list[tuple[int, ...]]] = {ROOT: [], **{u: [] for u in DEFAULT_UNITS}}
    for name, param in model.named_parameters():
        child = name.split(".")[0]
        shapes[child if child in DEFAULT_UNITS else ROOT].append(tuple(param.shape))
    return shapes


def expected_step(strategy: str, workload: str, world_size: int, pad: bool = True) -> cv.Volume:
    shapes = tiny_shapes() if workload == "gpt" else toy_shapes()
    # The toy is wrapped by FSDP1 with use_orig_params=False (per-rank chunk padding), mini_gpt with True.
    orig = workload == "gpt"
    if pad or strategy == "ddp":
        return cv.step(strategy, shapes, world_size, root=ROOT, use_orig_params=orig)
    raw = {u: sum(_numel(s) for s in ss) for u, ss in shapes.items()}  # what the step would be without padding
    return cv.sharded_step(raw, cv.freed_after_forward(strategy, raw, ROOT), 4, world_size)


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


# -- building and stepping each strategy -------------------------------------------------------------------------
def _build(ctx: RankContext, strategy: str, workload: str, **options: Any) -> tuple[nn.Module, Callable[[int], None]]:
    """A model of ``workload`` ("gpt": mini_gpt tiny, "toy") under ``strategy`` and a function running step i."""
    if workload == "gpt":
        model: nn.Module = GPT(preset("tiny"), seed=0).to(ctx.device)
    else:
        model = toy_model(ctx.device)
    if strategy == "ddp":
        model = wrap_ddp(model, ctx, **options)
    elif strategy in cv.FSDP1:
        from torch.distributed.fsdp import ShardingStrategy

        if workload == "gpt":
            model = fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy[cv.FSDP1[strategy]], **options)
        else:
            model = wrap_fsdp1(model, ctx, strategy=cv.FSDP1[strategy], **options)
    elif strategy in cv.FSDP2:
        raf = cv.FSDP2[strategy]
        kwargs = {} if raf is None else {"reshard_after_forward": raf}
        if workload == "gpt":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
            for block in model.blocks:
                fully_shard(block, mesh=mesh, **kwargs)
            fully_shard(model, mesh=mesh, **kwargs)
        else:
            model = wrap_fsdp2(model, ctx, **kwargs) if kwargs else _fsdp2_default_toy(model, ctx)
    else:
        raise ValueError(f"unknown strategy {strategy!r}")
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def run(i: int) -> None:
        if workload == "gpt":
            _, loss = model(*batch(ctx, step=i))
            loss.backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
        else:
            train_step(model, optim, toy_batch(ctx, step=i))

    return model, run


def _fsdp2_default_toy(model: nn.Module, ctx: RankContext) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for name in DEFAULT_UNITS:
        fully_shard(getattr(model, name), mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _io() -> dict[str, int]:
    """This process's I/O counters: ``wchar`` bytes passed to write calls, ``syscw`` write calls."""
    text = Path("/proc/self/io").read_text()
    return {key: int(value) for key, value in (line.split(": ") for line in text.splitlines())}


def _summary(comm: CommLog) -> dict[str, Any]:
    counts: dict[str, dict[str, int]] = {"forward": {}, "backward": {}}
    for c in comm:
        phase = counts["backward" if c.in_backward else "forward"]
        phase[c.op] = phase.get(c.op, 0) + 1
    events = comm.crosscheck.observed if comm.crosscheck is not None else []
    return {
        "counts": counts,
        "logical": comm.nbytes(),
        "ring": comm.ring_bytes(),
        "records": [(c.op, c.numel, c.dtype, c.in_backward, c.caller) for c in comm],
        "events": [(f"{e.backend}:{e.name}", e.numel) for e in events],
    }


def measure(ctx: RankContext, strategy: str, workload: str = "gpt", steps: int = STEPS, wire_step: int | None = None,
            **options: Any) -> list[dict[str, Any]]:  # fmt: skip
    """Each step's collectives, summarized. Step ``wire_step`` (from 0) instead runs bare, without the recorder and
    its profiler, and reports only the write calls it made (``{"wire": {"wchar", "syscw"}}``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a warning printed inside a step would count as wire bytes
        _, run = _build(ctx, strategy, workload, **options)
        out: list[dict[str, Any]] = []
        for i in range(steps):
            dist.barrier()
            if i == wire_step:
                before = _io()
                run(i)
                after = _io()
                out.append({"wire": {k: after[k] - before[k] for k in ("wchar", "syscw")}})
                continue
            with record_comm() as comm:
                run(i)
            out.append(_summary(comm))
    dist.barrier()
    return out


def _close(observed: float, expected: Fraction) -> bool:
    return abs(Fraction(observed) - expected) <= Fraction(1, 10**9) * max(1, abs(expected))


def _require_step(step: dict[str, Any], model: cv.Volume, index: int, strategy: str) -> None:
    require_equal(step["counts"], model.counts(), reason="counts-differ-from-model",
                  what=f"{strategy} step {index + 1}: collectives per phase", step=index + 1,
                  logical=step["logical"], ring=step["ring"])  # fmt: skip
    same = step["logical"] == model.logical and _close(step["ring"], model.ring)
    require(same, "bytes-differ-from-model",
            f"{strategy} step {index + 1}: {step['logical']} logical / {step['ring']} ring-model bytes, the model "
            f"says {model.logical} / {float(model.ring)}",
            step=index + 1, observed=[step["logical"], step["ring"]],
            expected=[model.logical, float(model.ring)])  # fmt: skip


# -- claims ----------------------------------------------------------------------------------------------------
def ddp_volume(ctx: RankContext, expected: Expected, bucket_cap_mb: float = 0.1) -> dict[str, Any]:
    """DDP's step is all-reduces of |θ| gradient elements in all: 2(N−1)/N·4|θ| ring-model bytes per rank, at steps
    1 and 3; step 2 adds only the bucket rebuild's broadcasts (``expected``: the guide's block, one broadcast per
    row, in order), from ``_pre_forward``. Smaller buckets change the number of all-reduces, not the bytes."""
    model = expected_step("ddp", "gpt", ctx.world_size)
    steps = measure(ctx, "ddp")
    for i in (0, 2):
        _require_step(steps[i], model, i, "ddp")
    second = steps[1]
    broadcasts = [r for r in second["records"] if r[0] == "broadcast"]
    rest = [r for r in second["records"] if r[0] != "broadcast"]
    observed = [f"broadcast {numel} {dtype.removeprefix('torch.')}" for _, numel, dtype, _, _ in broadcasts]
    expected.require_rows(observed, reason="rebuild-broadcasts", what="step 2's broadcasts")
    callers = sorted({(r[3], r[4].rsplit(":", 1)[-1]) for r in broadcasts})
    require_equal(callers, [(False, "DistributedDataParallel._pre_forward")], reason="rebuild-broadcasts",
                  what="(in backward, caller) of step 2's broadcasts")  # fmt: skip
    require_equal([(r[0], r[1]) for r in rest], [(o.op, o.numel) for o in model.ops], reason="counts-differ-from-model",
                  what="step 2's all-reduces", step=2)  # fmt: skip
    small = measure(ctx, "ddp", bucket_cap_mb=bucket_cap_mb)
    for i in (0, 2):
        _require_step({**small[i], "counts": steps[i]["counts"]}, model, i, f"ddp bucket_cap_mb={bucket_cap_mb}")
    small_count = small[2]["counts"]["backward"].get("all_reduce", 0)
    require(small_count > 1, "one-bucket-anyway", f"bucket_cap_mb={bucket_cap_mb} still all-reduced {small_count} "
            "time(s)", observed=small_count)  # fmt: skip
    return {
        "logical": steps[2]["logical"],
        "ring": steps[2]["ring"],
        "all_reduces": steps[2]["counts"]["backward"].get("all_reduce", 0),
        "rebuild": observed,
        "small_buckets": {"all_reduces": small_count, "logical": small[2]["logical"], "ring": small[2]["ring"]},
    }


def strategy_volume(ctx: RankContext, strategy: str, workload: str = "gpt") -> dict[str, Any]:
    """Every step of ``strategy`` issues the model's collectives, of the model's bytes, and its ring-model bytes
    over DDP's steady step are the model's ratio, which for mini_gpt tiny (no padding) is the closed form."""
    ddp_model = expected_step("ddp", workload, ctx.world_size)
    model = expected_step(strategy, workload, ctx.world_size)
    ddp = measure(ctx, "ddp", workload)[-1]
    _require_step(ddp, ddp_model, STEPS - 1, "ddp")
    steps = measure(ctx, strategy, workload)
    observed_ratio = Fraction(steps[-1]["ring"]) / Fraction(ddp["ring"])
    for i, step in enumerate(steps):
        try:
            _require_step(step, model, i, strategy)
        except Violation as violation:
            violation.details["ratio"] = float(Fraction(step["ring"]) / Fraction(ddp["ring"]))
            violation.details["model_ratio"] = float(cv.ratio(model, ddp_model))
            raise
    shapes = tiny_shapes() if workload == "gpt" else toy_shapes()
    theta = sum(_numel(s) for ss in shapes.values() for s in ss)
    root = sum(_numel(s) for s in shapes[ROOT])
    textbook = cv.textbook_ratio(strategy, theta, root)
    require(observed_ratio == cv.ratio(model, ddp_model), "ratio-differs-from-model",
            f"{strategy}/DDP = {float(observed_ratio)}", observed=float(observed_ratio),
            expected=float(cv.ratio(model, ddp_model)))  # fmt: skip
    if workload == "gpt":
        require(observed_ratio == textbook, "not-textbook-ratio", f"{strategy}/DDP = {observed_ratio}, the closed "
                f"form gives {textbook}", observed=float(observed_ratio), expected=float(textbook))  # fmt: skip
    backward_gathers = sorted(r[1] for r in steps[-1]["records"] if r[0] == "all_gather" and r[3])
    return {
        "ddp": {"logical": ddp["logical"], "ring": ddp["ring"]},
        "logical": steps[-1]["logical"],
        "ring": steps[-1]["ring"],
        "ratio": float(observed_ratio),
        "ratio_exact": str(observed_ratio),
        "logical_ratio": steps[-1]["logical"] / ddp["logical"],
        "counts": steps[-1]["counts"],
        "backward_all_gathers": len(backward_gathers),
        "backward_all_gather_numels": backward_gathers,
    }


def padded_toy(ctx: RankContext, pad: bool = True) -> dict[str, Any]:
    """On the toy at N=4 FSDP pads (FSDP1 the root's 30 elements to 32, FSDP2 every 7- or 5-row dim 0 to 8): every
    strategy's step is still exactly the model's, and the ratios exceed the closed forms by the padding."""
    ddp_model = expected_step("ddp", "toy", ctx.world_size, pad)
    out: dict[str, Any] = {}
    ddp = measure(ctx, "ddp", "toy")
    _require_step(ddp[-1], ddp_model, STEPS - 1, "ddp")
    shapes = toy_shapes()
    theta = sum(_numel(s) for ss in shapes.values() for s in ss)
    root = sum(_numel(s) for s in shapes[ROOT])
    for strategy in ("full-shard", "shard-grad-op", "fsdp2"):
        model = expected_step(strategy, "toy", ctx.world_size, pad)
        steps = measure(ctx, strategy, "toy")
        for i, step in enumerate(steps):
            _require_step(step, model, i, strategy)
        observed = Fraction(steps[-1]["ring"]) / Fraction(ddp[-1]["ring"])
        textbook = cv.textbook_ratio(strategy, theta, root)
        require(observed > textbook, "no-padding-seen", f"{strategy}: ratio {observed} is not above {textbook}",
                observed=float(observed), expected=float(textbook))  # fmt: skip
        out[strategy] = {"logical": steps[-1]["logical"], "ring": steps[-1]["ring"], "ratio": float(observed),
                         "textbook": float(textbook)}  # fmt: skip
    out["ddp"] = {"logical": ddp[-1]["logical"], "ring": ddp[-1]["ring"]}
    return out


def _wire_bounds(ctx: RankContext, what: str, wire: dict[str, int], model: Fraction, header: int,
                 **details: Any) -> dict[str, Any]:  # fmt: skip
    """Summed over ranks (a ring rank may send a few elements more or less than S/N when its chunks do not divide
    evenly, but every chunk travels the same number of hops): N · model ≤ bytes written ≤ N · model + header ·
    write calls. Returns the sums and this rank's payload (written less the headers)."""
    everyone = ctx.gather((wire["wchar"], wire["syscw"]))
    wchar, syscw = sum(w for w, _ in everyone), sum(c for _, c in everyone)
    total = model * ctx.world_size
    info = {"wchar": wchar, "syscw": syscw, "payload": wchar - header * syscw, "model": float(total),
            "per_rank": [w - header * c for w, c in everyone], **details}  # fmt: skip
    require(wchar >= total, "wire-below-gloo-model", f"{what}: {wchar} bytes written by all ranks, fewer than "
            f"the {float(total)} of gloo's all-reduce-based model", **info)  # fmt: skip
    require(wchar <= total + header * syscw, "wire-above-gloo-model",
            f"{what}: {wchar} bytes written in {syscw} calls, more than {float(total)} + {header} per call",
            **info)  # fmt: skip
    return info


def gloo_reduce_scatter_is_all_reduce(ctx: RankContext, header_bytes: int, numel: int = 1 << 16) -> dict[str, Any]:
    """One ``reduce_scatter_single`` of S: the recorder sees a reduce-scatter, gloo's profiler an all-reduce of all
    S elements, and the socket writes carry the all-reduce's ring bytes, 2(N−1)/N·S, twice the ring model's
    reduce-scatter; an all-reduce of S writes the same, an all-gather of S half."""
    n = ctx.world_size
    nbytes = numel * 4
    calls = {
        "all_reduce": lambda: dist.all_reduce(torch.ones(numel)),
        "reduce_scatter": lambda: dist.reduce_scatter_single(torch.empty(numel // n), torch.ones(numel)),
        "all_gather": lambda: dist.all_gather_single(torch.empty(numel), torch.ones(numel // n)),
    }
    gloo_kind = {"all_reduce": "all_reduce", "reduce_scatter": "all_reduce", "all_gather": "all_gather"}
    out: dict[str, Any] = {}
    for op, call in calls.items():
        call()  # warm-up: connections and buffers
        dist.barrier()
        with record_comm() as comm:  # what torch and gloo's profiler events say it is
            call()
        dist.barrier()
        before = _io()  # what it writes, bare: the recorder's profiler writes a little of its own
        call()
        after = _io()
        dist.barrier()
        wire = {k: after[k] - before[k] for k in ("wchar", "syscw")}
        events = [(e.name, e.numel) for e in comm.crosscheck.observed] if comm.crosscheck else []
        # gloo's all-gather event carries this rank's input, S/N; its all-reduce the full tensor
        expected_events = [(gloo_kind[op], numel // n if op == "all_gather" else numel)]
        require_equal(events, expected_events, reason="reduce-scatter-event-not-all-reduce" if op == "reduce_scatter"
                      else "unexpected-events", what=f"gloo's events for one {op}")  # fmt: skip
        require_equal([c.op for c in comm], [op], reason="unexpected-records", what=f"records of one {op}")
        model = cv.ring_bytes(gloo_kind[op], nbytes, n)
        info = _wire_bounds(ctx, op, wire, model, header_bytes, events=events)
        out[op] = {**info, "ring_model": comm[0].ring_bytes, "events": events,
                   "wire_over_ring_model": info["payload"] / (n * comm[0].ring_bytes)}  # fmt: skip
    return out


def gloo_wire_per_step(ctx: RankContext, header_bytes: int) -> dict[str, Any]:
    """A steady training step of each strategy writes gloo's model of it (every reduce-scatter an all-reduce of its
    input) plus at most a header per write call, and more than the ring model of the recorded collectives
    allows: on gloo SHARD_GRAD_OP costs 1.5× DDP on the wire, FSDP2 fully resharded 2×."""
    out: dict[str, Any] = {}
    for strategy in ("ddp", "shard-grad-op", "full-shard", "fsdp2"):
        *_, recorded, bare = measure(ctx, strategy, steps=STEPS + 1, wire_step=STEPS)
        model = cv.gloo_step(expected_step(strategy, "gpt", ctx.world_size))
        ring_model = recorded["ring"] * ctx.world_size  # summed over ranks, like the wire bytes
        info = _wire_bounds(ctx, strategy, bare["wire"], model.ring, header_bytes, ring_model=ring_model)
        if strategy != "ddp":
            require(info["payload"] > ring_model, "wire-fits-ring-model",
                    f"{strategy}: {info['payload']} payload bytes, within the ring model's {ring_model}",
                    **info)  # fmt: skip
        out[strategy] = info
    for info in out.values():
        info["wire_ratio"] = info["payload"] / out["ddp"]["payload"]
        info["ring_ratio"] = info["ring_model"] / out["ddp"]["ring_model"]
    return out


# -- break-it recipes: this guide's behaviour bent on purpose (tests/break_it/ applies them) ---------------------
def free_root_after_forward(original: Any, state: Any, handle: Any) -> None:
    """`_post_forward_reshard` that frees the root too, as every other unit of a resharding strategy."""
    from torch.distributed.fsdp._flat_param import RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES
    from torch.distributed.fsdp._runtime_utils import _reshard

    if not handle:
        return
    _reshard(state, handle, handle._sharding_strategy in RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES)


def with_shard_grad_op(original: tuple[Any, ...]) -> tuple[Any, ...]:
    """``RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES`` with SHARD_GRAD_OP added: it frees after forward too."""
    from torch.distributed.fsdp._flat_param import HandleShardingStrategy

    return (*original, HandleShardingStrategy.SHARD_GRAD_OP)


def without_shard_grad_op(original: tuple[Any, ...]) -> tuple[Any, ...]:
    """``NO_RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES`` without SHARD_GRAD_OP (so its views are resharded too)."""
    from torch.distributed.fsdp._flat_param import HandleShardingStrategy

    return tuple(s for s in original if s != HandleShardingStrategy.SHARD_GRAD_OP)


def all_gather_twice(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """`FlatParamHandle._all_gather_flat_param` that gathers the same shard twice."""
    original(self, *args, **kwargs)
    return original(self, *args, **kwargs)


def _local_reduce_scatter(output: torch.Tensor, input: torch.Tensor, *args: Any, group: Any = None,
                          **kwargs: Any) -> None:  # fmt: skip
    """What a reduce-scatter leaves this rank if nothing is sent: its own chunk of its own input."""
    rank = dist.get_rank(group)
    output.copy_(input.reshape(-1).view(dist.get_world_size(group), -1)[rank].view_as(output))


@contextlib.contextmanager
def _reduce_scatter_replaced(replacement: Any) -> Iterator[None]:
    original = dist.reduce_scatter_single
    dist.reduce_scatter_single = replacement
    try:
        yield
    finally:
        dist.reduce_scatter_single = original


def reduce_grad_without_reduce_scatter(original: Any, state: Any, handle: Any) -> None:
    """`_reduce_grad` whose reduce-scatter sends nothing: each rank keeps its own chunk."""
    with _reduce_scatter_replaced(_local_reduce_scatter):
        original(state, handle)


def fsdp2_local_reduce_scatter(original: Any, self: Any, *, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                               group: Any, **kwargs: Any) -> None:  # fmt: skip
    """FSDP2's ``DefaultReduceScatter.__call__`` (called with keywords) that sends nothing."""
    _local_reduce_scatter(output_tensor, input_tensor, group=group)


def fsdp2_all_gather_twice(original: Any, *args: Any, **kwargs: Any) -> Any:
    """FSDP2's ``foreach_all_gather`` issued twice (the first result waited on and dropped)."""
    first = original(*args, **kwargs)
    if first is not None and first.all_gather_work is not None:
        first.all_gather_work.wait()
    return original(*args, **kwargs)


def root_kept_after_forward(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """FSDP2 ``FSDPState._lazy_init`` that keeps the root unsharded after forward even when
    ``reshard_after_forward=True`` was asked for (what torch did before pytorch#154704)."""
    result = original(self, *args, **kwargs)
    if self._is_root:
        for group in self._fsdp_param_groups:
            group.post_forward_mesh_info = None
    return result


def root_resharded_after_forward(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """FSDP2 ``FSDPState._lazy_init`` that reshards the root after forward even by default."""
    result = original(self, *args, **kwargs)
    if self._is_root:
        for group in self._fsdp_param_groups:
            group.post_forward_mesh_info = group.mesh_info
    return result


def ring_reduce_scatter(output: torch.Tensor, input: torch.Tensor, op: Any = None, group: Any = None,
                        async_op: bool = False) -> None:  # fmt: skip
    """A real ring reduce-scatter from point-to-point sends (sum only): N−1 steps, each sending one chunk of S/N to
    the right neighbour. What gloo's ``reduce_scatter_single`` would be if it were a ring."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    chunks = [c.clone() for c in input.reshape(-1).view(n, -1)]
    right = dist.get_global_rank(group, (rank + 1) % n) if group is not None else (rank + 1) % n
    left = dist.get_global_rank(group, (rank - 1) % n) if group is not None else (rank - 1) % n
    for s in range(n - 1):
        send, recv = (rank - s - 1) % n, (rank - s - 2) % n
        buffer = torch.empty_like(chunks[recv])
        works = dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, chunks[send], right, group), dist.P2POp(dist.irecv, buffer, left, group)]
        )
        for work in works:
            work.wait()
        chunks[recv] += buffer
    output.copy_(chunks[rank].view_as(output))


def with_ring_reduce_scatter(original: Any) -> Any:
    """Replacement for ``torch.distributed.reduce_scatter_single``."""
    return ring_reduce_scatter


def _twice_allreduce_hook(state, bucket):  # unannotated: DDP rejects any annotation but its own classes
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    dist.all_reduce(bucket.buffer().clone())
    return allreduce_hook(state, bucket)


def _bf16_allreduce_hook(state, bucket):  # unannotated: DDP rejects any annotation but its own classes
    """Each bucket averaged through a bfloat16 all-reduce (torch's ``bf16_compress_hook`` needs CUDA)."""
    buffer = bucket.buffer()
    low = buffer.to(torch.bfloat16)
    dist.all_reduce(low)
    buffer.copy_(low.float().div_(dist.get_world_size()))
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future


def ddp_with_comm_hook(original: Any, self: Any, *args: Any, hook_name: str = "twice", **kwargs: Any) -> None:
    """``DistributedDataParallel.__init__`` that registers a communication hook: ``twice`` all-reduces each bucket
    twice; ``bf16`` all-reduces each bucket in bfloat16."""
    original(self, *args, **kwargs)
    hook = {"twice": _twice_allreduce_hook, "bf16": _bf16_allreduce_hook}[hook_name]
    self.register_comm_hook(None, hook)
