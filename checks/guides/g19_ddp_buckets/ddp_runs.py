"""What every claim of guide 19 runs: its workloads (six ``Linear(256, 256)``, mini_gpt presets) under DDP, the
settings the bucket model reads, iterations of forward and backward with the reducer's buckets, collectives and
ready gradients recorded around each, and the reducer's buckets as parameter indices."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from checks.models import ddp_buckets as db
from checks.probes.comm import CommLog, record_comm
from checks.probes.event_log import EventLog
from checks.probes.grad_ready import record_grad_ready
from checks.ranks.context import RankContext
from checks.workloads.gpt import batch
from checks.workloads.toy import wrap_ddp
from mini_gpt import GPT, preset

LINEAR_WIDTH, LINEAR_DEPTH = 256, 6  # six Linear(256, 256): 1,579,008 bytes, across the 1 MiB first bucket
LR = 1e-3
LAST_BUCKET_CAP = "DDP_SET_LAST_BUCKET_CAP"  # read by the reducer's C++ rebuild; "1" (exactly) moves the small cap last


# -- workloads ----------------------------------------------------------------------------------------------------
def linears(device: torch.device | str = "cpu", seed: int = 0) -> nn.Sequential:
    """Six Linear(256, 256), weights from ``seed`` alone: twelve parameters, 394,752 elements."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(*(nn.Linear(LINEAR_WIDTH, LINEAR_WIDTH) for _ in range(LINEAR_DEPTH)))
    return model.to(device)


def model_of(ctx: RankContext, workload: str) -> nn.Module:
    """``linears``, or a mini_gpt preset (``tiny``, ``grammar``) with its deterministic init."""
    if workload == "linears":
        return linears(ctx.device)
    return GPT(preset(workload), seed=0).to(ctx.device)


def loss_of(model: nn.Module, ctx: RankContext, workload: str, step: int) -> torch.Tensor:
    """This rank's loss on its own inputs of ``step`` (different on every rank and step)."""
    if workload == "linears":
        generator = torch.Generator().manual_seed(97 * step + ctx.rank)
        return model(torch.randn(4, LINEAR_WIDTH, generator=generator).to(ctx.device)).sum()
    _, loss = model(*batch(ctx, step=step, preset_name=workload))
    return loss


def ddp_of(ctx: RankContext, workload: str, **options: Any) -> nn.Module:
    return wrap_ddp(model_of(ctx, workload), ctx, **options)


# -- what the bucket model reads ----------------------------------------------------------------------------------
def params_of(ddp: nn.Module) -> list[db.Param]:
    """What the bucket model reads of each parameter, in DDP's order (``module.parameters()``: registration
    order, a tied weight once)."""
    return [db.Param(p.numel(), p.element_size(), str(p.dtype).removeprefix("torch.")) for p in ddp.module.parameters()]


def names_of(ddp: nn.Module) -> list[str]:
    return [name for name, _ in ddp.module.named_parameters()]


def options_of(options: dict[str, Any], env: dict[str, str] | None = None) -> db.Options:
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


# -- the reducer's buckets, and iterations that record them -----------------------------------------------------
def reducer_buckets(ddp: nn.Module) -> list[list[int]]:
    """The reducer's buckets in its order, each as parameter indices in bucket order."""
    index = {id(p): i for i, p in enumerate(ddp.module.parameters())}
    return [[index[id(p)] for p in bucket.parameters()] for bucket in ddp.reducer._get_zeros_like_grad_buckets()]


def flat(buckets: list[list[int]]) -> list[int]:
    return [i for bucket in buckets for i in bucket]


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
                loss_of(ddp, ctx, workload, step).backward()
            trace.after.append(reducer_buckets(ddp))
            trace.comm.append(comm)
            trace.rebuilt.append(bool(ddp._has_rebuilt_buckets))
            ddp.zero_grad(set_to_none=True)
    trace.ready = ready
    return trace


def parameters_flat(model: nn.Module) -> torch.Tensor:
    """Every parameter of ``model``, flattened into one cpu tensor (to compare replicas bitwise)."""
    return torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
