"""Checks of the harness itself: what the pool's own tests run on real ranks.

Each one exercises one thing a real check can do to a rank: answer, fail, hang, crash, leak a group.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist

from checks.ranks import isolation
from checks.ranks.context import RankContext


def identify(ctx: RankContext) -> dict[str, Any]:
    """Who am I: rank, pid, world size, backend, device."""
    return {
        "rank": ctx.rank,
        "pid": os.getpid(),
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "device": str(ctx.device),
    }


def process(ctx: RankContext, variable: str = "FSDP_READINGS_ZYGOTE_TEST", module: str | None = None) -> dict[str, Any]:
    """This rank's process as it was started: its parent, its session, an environment variable, whether
    ``module`` imports (from the pool's search path) and whether it was imported before this check."""
    import importlib
    import sys

    found = True
    imported_before = module in sys.modules
    if module is not None:
        try:
            importlib.import_module(module)
        except ImportError:
            found = False
    return {
        "pid": os.getpid(),
        "parent": os.getppid(),
        "session": os.getsid(0),
        "variable": os.environ.get(variable),
        "module_found": found,
        "imported_before": imported_before,
    }


def all_reduce_sum(ctx: RankContext, value: float = 1.0) -> float:
    """All-reduce ``value * (rank + 1)``; every rank must see value * N(N+1)/2."""
    t = torch.tensor([value * (ctx.rank + 1)], device=ctx.device, dtype=torch.float64)
    dist.all_reduce(t)
    expected = value * ctx.world_size * (ctx.world_size + 1) / 2
    assert t.item() == expected, f"all_reduce gave {t.item()}, expected {expected}"
    return t.item()


def trivial(ctx: RankContext) -> int:
    """The cheapest possible check: the pool's per-check overhead is everything this costs."""
    return ctx.rank


def raise_on(ctx: RankContext, rank: int = 1, message: str = "deliberate failure", then_barrier: bool = True) -> int:
    """Fail on one rank after a collective; with ``then_barrier`` the others block in the next collective."""
    dist.barrier()
    if ctx.rank == rank:
        raise ValueError(f"{message} on rank {ctx.rank}")
    if then_barrier:
        dist.barrier()  # the failed rank never arrives: the pool must unblock us
    return ctx.rank


def hang_on(ctx: RankContext, rank: int = 1, seconds: float = 3600.0) -> int:
    """One rank sleeps in Python (a hang whose stack names this function)."""
    if ctx.rank == rank:
        time.sleep(seconds)
    return ctx.rank


def crash_on(ctx: RankContext, rank: int = 1, how: str = "segfault") -> int:
    """Kill one rank: ``segfault`` (a NULL read), ``abort`` (SIGABRT), or ``kill`` (SIGKILL)."""
    dist.barrier()
    if ctx.rank == rank:
        if how == "segfault":
            ctypes.string_at(0)
        elif how == "abort":
            os.abort()
        elif how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        else:
            raise ValueError(f"unknown crash {how!r}; use segfault, abort or kill")
    dist.barrier()
    return ctx.rank


def exit_on(ctx: RankContext, rank: int = 1, code: int = 3) -> int:
    """One rank leaves with ``os._exit(code)``."""
    if ctx.rank == rank:
        os._exit(code)
    return ctx.rank


def leak_state(ctx: RankContext) -> dict[str, Any]:
    """Change everything isolation must undo: RNG, default dtype, grad mode, threads; create a subgroup."""
    group = dist.new_group(list(range(ctx.world_size)))
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.set_num_threads(max(torch.get_num_threads() + 1, 2))
    t = torch.ones(1, device=ctx.device)
    dist.all_reduce(t, group=group)
    return {"groups": len(dist.distributed_c10d._world.pg_map), "random": torch.rand(1).item()}


def observe_state(ctx: RankContext) -> dict[str, Any]:
    """What a check sees on arrival: the first random draw, default dtype, grad mode, threads, live groups."""
    return {
        "random": torch.rand(1).item(),
        "default_dtype": str(torch.get_default_dtype()),
        "grad_enabled": torch.is_grad_enabled(),
        "num_threads": torch.get_num_threads(),
        "groups": len(dist.distributed_c10d._world.pg_map),
    }


def returns_unpicklable(ctx: RankContext) -> Any:
    return lambda: None


def train_fsdp_and_ddp(ctx: RankContext) -> int:
    """Build FSDP1, FSDP2 and DDP models and take a step with each: objects isolation must clean up."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
    from torch.nn.parallel import DistributedDataParallel

    def model() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(ctx.device)

    fsdp1 = FullyShardedDataParallel(model(), device_id=ctx.device, use_orig_params=True)
    ddp = DistributedDataParallel(model(), device_ids=[ctx.device] if ctx.on_gpu else None)
    fsdp2 = model()
    fully_shard(fsdp2, mesh=init_device_mesh(ctx.device.type, (ctx.world_size,)))
    for wrapped in (fsdp1, ddp, fsdp2):
        wrapped(torch.randn(3, 4, device=ctx.device)).sum().backward()
    return ctx.rank


def live_wrappers(ctx: RankContext) -> dict[str, int]:
    """How many FSDP1 / DDP / FSDP2 modules are alive on this rank right now."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    from torch.nn.parallel import DistributedDataParallel

    kinds = {"fsdp1": FullyShardedDataParallel, "ddp": DistributedDataParallel, "fsdp2": FSDPModule}
    objects = isolation.live_objects()
    return {name: sum(isinstance(o, kind) for o in objects) for name, kind in kinds.items()}


_KEPT: list[Any] = []


def keep_wrapper_alive(ctx: RankContext, keep: bool = True) -> int:
    """Hold an FSDP1 module in a module global (what isolation cannot undo), or let the last one go."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    _KEPT.clear()
    if keep:
        _KEPT.append(FullyShardedDataParallel(torch.nn.Linear(2, 2).to(ctx.device), device_id=ctx.device))
    return len(_KEPT)


def violate_on(ctx: RankContext, rank: int = 1) -> int:
    """One rank finds its claim false (a `Violation` with a reason and details); the others pass."""
    from checks.violation import require_equal

    if ctx.rank == rank:
        require_equal({"blocks.0": 64080}, {"blocks.0": 0}, reason="held-after-forward", what="bytes held")
    return ctx.rank


def violation_with_unpicklable_details(ctx: RankContext) -> int:
    """A `Violation` whose details hold something that cannot travel back (it arrives as its repr)."""
    from checks.violation import Violation

    raise Violation("odd-details", "details with a lambda", fn=lambda: None, n=3)


def poison_all_reduce(ctx: RankContext, rank: int = 1) -> int:
    """Leave ``dist.all_reduce`` a no-op on one rank after the check (what isolation cannot undo), so the pool's
    health check gets a wrong sum from that rank and must retire the pool."""
    if ctx.rank == rank:
        dist.all_reduce = lambda tensor, *args, **kwargs: None
    return ctx.rank
