"""Rank-side functions the probes' own tests run (``tests/probes``): they record, and return what was recorded.

They assert nothing about FSDP: the tests compare what comes back with expectations computed independently, in
pytest's process. Sabotage factories for `Patch` live here too, so the ranks can import them.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

# Holders the coverage check calls through: names bound by ``from ... import`` at import time, as torch modules do.
from torch.distributed import all_gather_single as imported_all_gather_single
from torch.distributed.distributed_c10d import all_gather_into_tensor as imported_all_gather_into_tensor

from checks.probes.comm import UnrecordedCollectives, record_comm
from checks.probes.crosscheck import BackendEvents
from checks.probes.events import record_events
from checks.probes.memory import snapshot
from checks.probes.step import StepRecord, record_step
from checks.ranks import marks
from checks.ranks.context import RankContext
from checks.workloads import toy

# -- building and stepping the toy under every wrapper -------------------------------------------------------------
WRAPPERS = ("ddp", "fsdp1", "fsdp2", "zero", "single")


def build(ctx: RankContext, kind: str, **options: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = toy.toy_model(ctx.device)
    if kind == "ddp":
        wrapped = toy.wrap_ddp(model, ctx)
    elif kind == "fsdp1":
        wrapped = toy.wrap_fsdp1(model, ctx, **options)
    elif kind == "fsdp2":
        fsdp2_prefetch = options.pop("explicit_prefetch", None)
        wrapped = toy.wrap_fsdp2(model, ctx, **options)
        if fsdp2_prefetch:
            _explicit_prefetch(wrapped, fsdp2_prefetch)
    elif kind == "zero":
        return toy.wrap_zero(model, ctx)
    elif kind == "single":
        wrapped = model
    else:
        raise ValueError(f"unknown wrapper {kind!r}; one of {WRAPPERS}")
    return wrapped, toy.adam(wrapped.parameters())


def _explicit_prefetch(model: torch.nn.Module, lists: dict[str, dict[str, list[str]]]) -> None:
    """``{"forward": {"0": ["1"]}, "backward": {"1": ["0"]}}``: FSDP2's explicit prefetch lists by child name."""

    def module(name: str) -> Any:
        return model if name == "" else getattr(model, name)

    for name, targets in lists.get("forward", {}).items():
        module(name).set_modules_to_forward_prefetch([module(t) for t in targets])
    for name, targets in lists.get("backward", {}).items():
        module(name).set_modules_to_backward_prefetch([module(t) for t in targets])


def step_probes(ctx: RankContext, kind: str, steps: int = 1, peaks: bool = False, **options: Any) -> StepRecord:
    """Build ``kind`` over the toy and record ``steps`` training steps with all three probes (no zero_grad after
    the last step, so gradients are still there for the memory snapshot); ``peaks`` adds the memory peaks."""
    model, optim = build(ctx, kind, **options)
    with record_step(model, optim, peaks=peaks) as step:
        for i in range(steps):
            model(toy.toy_batch(ctx, step=i)).sum().backward()
            optim.step()
            if i < steps - 1:
                optim.zero_grad(set_to_none=True)
    return step


def memory_after_step(
    ctx: RankContext, kinds: tuple[str, ...] = WRAPPERS, options: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Snapshot (no peaks) after one step under each wrapper, in one check: for fractions between wrappers.
    ``options``: wrap options per wrapper name."""
    out: dict[str, Any] = {}
    for kind in kinds:
        model, optim = build(ctx, kind, **(options or {}).get(kind, {}))
        model(toy.toy_batch(ctx)).sum().backward()
        optim.step()
        out[kind] = snapshot(model, optim)
    return out


def comm_and_memory(ctx: RankContext, kinds: tuple[str, ...] = ("ddp", "fsdp1", "fsdp2", "zero")) -> dict[str, Any]:
    """Comm log and memory account of one step under each wrapper (the few 4-rank tests use this)."""
    out: dict[str, Any] = {}
    for kind in kinds:
        step = step_probes(ctx, kind)
        out[kind] = (step.comm, step.memory)
    return out


# -- comm recorder coverage ----------------------------------------------------------------------------------------
def _api_cases(n: int, rank: int) -> dict[str, Callable[[], Any]]:
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.distributed_c10d import _coalescing_manager

    def t(k: int) -> torch.Tensor:
        return torch.ones(k)

    def coalesced(issue: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            with _coalescing_manager():
                issue()

        return run

    def dtensor_full() -> Any:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (n,))
        return distribute_tensor(torch.ones(4 * n, 3), mesh, [Shard(0)], src_data_rank=None).full_tensor()

    def funcol_autograd() -> None:  # a collective with an autograd formula, and its backward's collective
        x = t(4).requires_grad_()
        funcol.wait_tensor(funcol.all_gather_tensor_autograd(x, 0, dist.group.WORLD)).sum().backward()
        assert x.grad is not None and x.grad.eq(n).all(), x.grad  # the formula: a reduce-scatter of ones

    def async_all_reduce() -> None:
        work = dist.all_reduce(t(6), async_op=True)
        assert work is not None
        work.wait()

    return {
        "all_reduce": lambda: dist.all_reduce(t(6)),
        "all_reduce_coalesced": lambda: dist.all_reduce_coalesced([t(3), t(5)]),
        "async all_reduce": async_all_reduce,
        "all_gather_single": lambda: dist.all_gather_single(t(4 * n), t(4)),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(t(4 * n), t(4)),
        "_all_gather_base": lambda: dist.distributed_c10d._all_gather_base(t(4 * n), t(4)),
        "from-imported all_gather_single": lambda: imported_all_gather_single(t(4 * n), t(4)),
        "from-imported all_gather_into_tensor": lambda: imported_all_gather_into_tensor(t(4 * n), t(4)),
        "all_gather (list)": lambda: dist.all_gather([t(4) for _ in range(n)], t(4)),
        "all_gather_coalesced": lambda: dist.all_gather_coalesced([[t(3), t(5)] for _ in range(n)], [t(3), t(5)]),
        "coalescing manager all_gather": coalesced(
            lambda: (dist.all_gather_single(t(3 * n), t(3)), dist.all_gather_single(t(5 * n), t(5)))
        ),
        "reduce_scatter_single": lambda: dist.reduce_scatter_single(t(2), t(2 * n)),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(t(2), t(2 * n)),
        "_reduce_scatter_base": lambda: dist.distributed_c10d._reduce_scatter_base(t(2), t(2 * n)),
        "reduce_scatter (list)": lambda: dist.reduce_scatter(t(2), [t(2) for _ in range(n)]),
        "coalescing manager reduce_scatter": coalesced(
            lambda: (dist.reduce_scatter_single(t(3), t(3 * n)), dist.reduce_scatter_single(t(5), t(5 * n)))
        ),
        "broadcast": lambda: dist.broadcast(t(6), src=0),
        "barrier": dist.barrier,
        "all_gather_object": lambda: dist.all_gather_object([None] * n, rank),
        "funcol all_reduce": lambda: funcol.all_reduce(t(6), "sum", dist.group.WORLD).wait(),
        "funcol all_gather_tensor": lambda: funcol.all_gather_tensor(t(4), 0, dist.group.WORLD).wait(),
        "funcol all_gather_tensor_autograd": funcol_autograd,
        "funcol reduce_scatter_tensor": lambda: funcol.reduce_scatter_tensor(
            t(2 * n), "sum", 0, dist.group.WORLD
        ).wait(),
        "DTensor full_tensor": dtensor_full,
    }


def api_coverage(ctx: RankContext, cases: list[str] | None = None) -> dict[str, Any]:
    """Run each collective API under its own `record_comm`; return the records (or the failure) per case."""
    import warnings

    out: dict[str, Any] = {}
    table = _api_cases(ctx.world_size, ctx.rank)
    for name in cases or list(table):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # deprecated names are the point
            try:
                with record_comm() as log:
                    table[name]()
                out[name] = log
            except UnrecordedCollectives as exc:
                out[name] = f"UnrecordedCollectives: {exc}"
        dist.barrier()
    return out


def unwrapped_collective(ctx: RankContext, how: str = "backend") -> str:
    """Issue a collective through a path the recorder does not see and report what `record_comm` said.

    ``backend``: a call on the backend object itself (``group._get_backend(device).allreduce``), which never
    reaches the dispatcher. ``inference``: a collective under ``torch.inference_mode()``, which skips the Autograd
    key where the recorder listens (as code running inside another operator's kernel does). ``thread``: a
    collective issued from a Python thread started inside the block: no blind spot (the recorder's kernels are
    process-wide), so this one must come back recorded.
    """
    t = torch.ones(5, device=ctx.device)
    try:
        with record_comm() as log:
            dist.all_reduce(t)  # a recorded one alongside
            if how == "backend":
                dist.group.WORLD._get_backend(ctx.device).allreduce([t]).wait()
            elif how == "inference":
                with torch.inference_mode():
                    dist.all_reduce(t)
            elif how == "thread":
                worker = threading.Thread(target=dist.all_reduce, args=(t,))
                worker.start()
                worker.join()
            else:
                raise ValueError(how)
    except UnrecordedCollectives as exc:
        return f"caught: {exc}"
    return f"missed: recorded {len(log)} collectives and the cross-check passed"


def reduce_scatter_via_all_reduce(original: Callable[..., Any]) -> Callable[..., Any]:
    """Sabotage for `Patch`: a reduce-scatter done as a full all-reduce plus a local copy (same numerics)."""

    @functools.wraps(original)
    def replacement(
        output: torch.Tensor, input: torch.Tensor, op: Any = None, group: Any = None, async_op: bool = False
    ):
        dist.all_reduce(input, group=group)
        output.copy_(input.chunk(dist.get_world_size(group))[dist.get_rank(group)])

    return replacement


# -- events and runtime evidence ------------------------------------------------------------------------------------
def events_with_evidence(ctx: RankContext, **options: Any) -> dict[str, Any]:
    """Record FSDP1 events while the pool's runtime evidence (`marks.watch`, via the request's ``trace``) is also
    active on some of the same functions; report the events, and the trace function during and after (neither
    observer installs one)."""
    model, optim = build(ctx, "fsdp1", **options)
    with record_events(model) as events:
        toy.train_step(model, optim, toy.toy_batch(ctx))
        tracer_during = _current_tracer()
    return {"events": events, "tracer_during": tracer_during is not None, "tracer_after": _current_tracer() is not None}


def _current_tracer() -> Any:
    import sys

    return sys.gettrace()


def nested_watch_and_events(ctx: RankContext) -> dict[str, Any]:
    """Enter watch, then record_events, leave watch first (not LIFO): both must keep working to their end."""
    model, _ = build(ctx, "fsdp2")
    watch = marks.watch(("torch.distributed.fsdp._fully_shard._fsdp_param_group:FSDPParamGroup.post_backward",))
    seen = watch.__enter__()
    with record_events(model) as events:
        model(toy.toy_batch(ctx)).sum().backward()
        watch.__exit__(None, None, None)
        model(toy.toy_batch(ctx, step=1)).sum().backward()
    return {"seen": sorted(seen), "events": events, "tracer_left": _current_tracer() is None}


# -- the three-line API ------------------------------------------------------------------------------------------------
def three_lines(ctx: RankContext, kind: str = "fsdp1") -> dict[str, Any]:
    """One training step recorded exactly as a guide check would write it (no model given to record_events)."""
    from checks.probes.memory import account_memory

    model, optim = build(ctx, kind)
    x = toy.toy_batch(ctx)
    with record_comm() as comm, record_events() as events, account_memory(model, optim, peaks=True) as mem:
        loss = model(x).sum()
        loss.backward()
        optim.step()
    return {"comm": comm, "events": events, "memory": mem}


# -- beyond the toy: mini_gpt --------------------------------------------------------------------------------------
# What the probe-overhead benchmark measures: each probe alone, all three (what `record_step` does by default),
# and the memory peaks that claims reading a peak opt into.
PROBES = ("none", "comm", "events", "memory", "memory-with-peaks", "all", "all-with-peaks")


def _mini_gpt(ctx: RankContext, backward_prefetch: str) -> tuple[Any, Any, Callable[[], None], dict[str, Any]]:
    """FSDP1 (use_orig_params, one unit per Block) over mini_gpt's tiny preset, warmed up by one step: the model,
    its optimizer, a step function and the probe contexts by `PROBES` name."""
    import contextlib

    from torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from checks.probes.memory import account_memory
    from mini_gpt.config import preset
    from mini_gpt.model import GPT, Block

    config = preset("tiny")
    model = FullyShardedDataParallel(
        GPT(config).to(ctx.device),
        device_id=ctx.device,
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        backward_prefetch=BackwardPrefetch[backward_prefetch],
        use_orig_params=True,
    )
    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(ctx.rank)
    x = torch.randint(0, config.vocab_size, (4, config.block_size), generator=generator).to(ctx.device)

    def step() -> None:
        out = model(x)
        (out[0] if isinstance(out, tuple) else out).float().square().mean().backward()
        optim.step()
        optim.zero_grad(set_to_none=True)

    step()
    probes = {
        "none": contextlib.nullcontext,
        "comm": record_comm,
        "events": lambda: record_events(model),
        "memory": lambda: account_memory(model, optim),
        "memory-with-peaks": lambda: account_memory(model, optim, peaks=True),
        "all": lambda: record_step(model, optim),
        "all-with-peaks": lambda: record_step(model, optim, peaks=True),
        # parts of a probe, for profiling (`mini_gpt_profile`); not benchmarked
        "comm-unwitnessed": lambda: record_comm(crosscheck=False),
        "witness": BackendEvents,
        # what every claim of `pytest readings/` runs under: runtime evidence's marks
        "watch": lambda: marks.watch(("torch.distributed.fsdp._runtime_utils:_reshard",)),
    }
    return model, optim, step, {"probes": probes, "config": config}


def mini_gpt_steps(
    ctx: RankContext, probe: str = "all", steps: int = 2, backward_prefetch: str = "BACKWARD_PRE"
) -> dict[str, Any]:
    """FSDP1 (use_orig_params, one unit per Block, BACKWARD_PRE) over mini_gpt's tiny preset: ``steps`` steps under
    ``probe``, after one warm-up step. Returns seconds per step and, with probes, what they recorded."""
    import time

    from mini_gpt.model import GPT

    _, _, step, built = _mini_gpt(ctx, backward_prefetch)
    config = built["config"]
    started, cpu = time.perf_counter(), time.thread_time()
    with built["probes"][probe]() as recorded:
        for _ in range(steps):
            step()
    out: dict[str, Any] = {
        "seconds_per_step": (time.perf_counter() - started) / steps,
        # this thread's CPU time: what the probe itself costs, less exposed to other processes on the machine
        "cpu_seconds_per_step": (time.thread_time() - cpu) / steps,
        "n_layer": config.n_layer,
    }
    if probe.startswith("all"):
        out["step"] = recorded
        reference = list(GPT(config).parameters())  # unwrapped: tied weights once
        out["numel"], out["tensors"] = sum(p.numel() for p in reference), len(reference)
    return out


def mini_gpt_overhead(ctx: RankContext, probe: str = "all", steps: int = 2, rounds: int = 5) -> dict[str, float]:
    """What ``probe`` costs on `mini_gpt_steps`' workload, as a ratio measured inside one rank run: ``rounds``
    times, ``steps`` bare steps and ``steps`` steps under the probe (in alternating order), on the same model; the
    best round of each (the one the machine disturbed least). Wall seconds (what a check waits) and this thread's
    CPU seconds (what the probe itself spends, less exposed to other processes on a shared machine)."""
    import contextlib
    import time

    _, _, step, built = _mini_gpt(ctx, "BACKWARD_PRE")
    best: dict[str, list[float]] = {"bare": [], "probed": []}
    cpu: dict[str, list[float]] = {"bare": [], "probed": []}
    blocks = [("bare", contextlib.nullcontext), ("probed", built["probes"][probe])]
    for round_ in range(rounds):
        for kind, context in blocks if round_ % 2 == 0 else blocks[::-1]:  # neither side always goes first
            dist.barrier()  # both ranks start the block together: no wait for the other's previous block
            started, cpu_started = time.perf_counter(), time.thread_time()
            with context():
                for _ in range(steps):
                    step()
            best[kind].append((time.perf_counter() - started) / steps)
            cpu[kind].append((time.thread_time() - cpu_started) / steps)
    bare, probed, bare_cpu, probed_cpu = min(best["bare"]), min(best["probed"]), min(cpu["bare"]), min(cpu["probed"])
    return {
        "bare_seconds_per_step": bare,
        "seconds_per_step": probed,
        "ratio_to_bare": probed / bare,
        "bare_cpu_seconds_per_step": bare_cpu,
        "cpu_seconds_per_step": probed_cpu,
        "cpu_ratio_to_bare": probed_cpu / bare_cpu,
    }


def mini_gpt_profile(ctx: RankContext, probe: str = "all", steps: int = 2, top: int = 25) -> dict[str, Any]:
    """Where a probed step's time goes: `mini_gpt_steps`' workload timed under ``probe``, then the same steps
    under cProfile; returns seconds per step (both) and the top ``top`` functions by own time, as text."""
    import cProfile
    import io
    import pstats
    import time

    _, _, step, built = _mini_gpt(ctx, "BACKWARD_PRE")
    started = time.perf_counter()
    with built["probes"][probe]():
        for _ in range(steps):
            step()
    plain = (time.perf_counter() - started) / steps
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()  # around the probe's entry and exit too: what a check pays for the block as a whole
    with built["probes"][probe]():
        for _ in range(steps):
            step()
    profiler.disable()
    profiled = (time.perf_counter() - started) / steps
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return {"seconds_per_step": plain, "profiled": profiled, "stats": text.getvalue()}


def probe_block_costs(ctx: RankContext, repeats: int = 20) -> dict[str, float]:
    """What entering and leaving each probe costs around an empty block on `mini_gpt_steps`' model (the fixed
    part of a probe's cost, which a short block pays in full): best of ``repeats``, seconds."""
    import time

    _, _, _, built = _mini_gpt(ctx, "BACKWARD_PRE")
    out: dict[str, float] = {}
    for name, probe in built["probes"].items():
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            with probe():
                pass
            best = min(best, time.perf_counter() - started)
        out[name] = best
    return out


# -- the gradient-ready recorder and the storages of collectives (DDP) -----------------------------------------------
def ddp_grad_ready(ctx: RankContext, steps: int = 2, bucket_cap_mb: float | None = None) -> dict[str, Any]:
    """The toy under DDP for ``steps`` steps inside `record_grad_ready` and `record_comm`, with
    ``gradient_as_bucket_view``: the log, the collectives, and each gradient's storage pointer after the last step."""
    from checks.probes.grad_ready import record_grad_ready

    model = toy.wrap_ddp(toy.toy_model(ctx.device), ctx, gradient_as_bucket_view=True, bucket_cap_mb=bucket_cap_mb)
    with record_grad_ready(model) as ready, record_comm() as comm:
        for i in range(steps):
            model(toy.toy_batch(ctx, step=i)).sum().backward()
    grads = [p.grad.untyped_storage().data_ptr() for p in model.parameters()]
    return {"ready": ready, "comm": comm, "grad_storages": grads}


# -- point-to-point peers and a pipeline stage's actions -------------------------------------------------------------
def point_to_point_peers(ctx: RankContext) -> list[tuple[str, int, int]]:
    """A ring of blocking sends and receives (rank r sends to r + 1 and receives from r − 1, even ranks first) and
    one batched isend / irecv pair the other way: (op, peer, elements) as recorded, in order."""
    n, r = ctx.world_size, ctx.rank
    right, left = (r + 1) % n, (r - 1) % n
    out, into = torch.full((3,), float(r)), torch.empty(3)
    with record_comm() as log:
        if r % 2 == 0:
            dist.send(out, right)
            dist.recv(into, left)
        else:
            dist.recv(into, left)
            dist.send(out, right)
        ops = [dist.P2POp(dist.isend, torch.ones(5), left), dist.P2POp(dist.irecv, torch.empty(5), right)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return [(c.op, c.peer, c.numel) for c in log]


def pipeline_stage_actions(ctx: RankContext, schedule: str = "1f1b", microbatches: int = 4) -> dict[str, Any]:
    """One step of a two-layer-per-stage pipeline under ``schedule``, recorded by `checks.probes.stages`: the
    actions in call order and the most microbatches the stage held."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from checks.probes.stages import actions, held_at_most, record_stage_actions

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    stage = PipelineStage(module, ctx.rank, ctx.world_size, ctx.device)
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    pipe = kind(stage, n_microbatches=microbatches, loss_fn=lambda out, target: (out - target).square().mean())
    x, y = torch.randn(2 * microbatches, 4), torch.randn(2 * microbatches, 4)
    with record_stage_actions(label=schedule) as log:
        if ctx.rank == 0:
            pipe.step(x)
        elif ctx.rank == ctx.world_size - 1:
            pipe.step(target=y)
        else:
            pipe.step()
    return {"actions": actions(log), "held": held_at_most(log), "stages": {e.target for e in log.events}}
