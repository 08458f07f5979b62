"""One FSDP1 step of a user's model on the rank pool, measured by the probes (rank side): what FSDP built, what a
rank holds after a step, the collectives of a steady step, each backward-prefetch mode's hooks, and one step's
gradients against DDP's. Nothing here predicts: `checks.inspect.predict` does, and `checks.inspect.compare`
puts the two side by side.

The batch comes from the input factory, called with no arguments under ``torch.manual_seed(97 * step + rank)``:
every rank its own batch, the same on every run. It may return a tensor, a tuple of positional arguments or a
dict of keyword arguments. The loss is the output's ``loss`` when it has one (a dict key or an attribute, as
Hugging Face models return with ``labels``), else the sum of every floating-point tensor the model returns.
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from checks.guides.g06_backward_prefetch import HOOK_KINDS, recorded_post_forward
from checks.guides.g13_zero_stages import make
from checks.guides.g20_auto_wrap import fsdp1_units, torch_policy
from checks.inspect import loading
from checks.inspect.tree import classes_of, module_paths
from checks.naming import ROOT, clean
from checks.probes import record_comm, record_events
from checks.probes.memory import snapshot
from checks.probes.memory_series import record_memory_series
from checks.ranks.context import RankContext

LR = 1e-3


class BatchRejected(Exception):
    """The model raised on the input factory's batch: the message is the model's own error."""


def batch_of(make_batch: Callable[[], Any], ctx: RankContext, step: int) -> Any:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(97 * step + ctx.rank)
        return make_batch()


def call(model: nn.Module, batch: Any) -> Any:
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, tuple | list):
        return model(*batch)
    return model(batch)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _tensors(item)


def loss_of(output: Any) -> torch.Tensor:
    """See the module docstring."""
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss.float().sum()
    floats = [t.float().sum() for t in _tensors(output) if t.is_floating_point() and t.requires_grad]
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
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from checks.naming import unit_name

    out = {}
    for path, module in wrapped.named_modules():
        if isinstance(module, FSDP) and module._handle is not None:
            flat = module._handle.flat_param
            numel, padded = sum(flat._numels), flat._padded_unsharded_size.numel()
            out[unit_name(path)] = {"numel": numel, "padded": padded, "shard": flat._sharded_size.numel(),
                                    "padding": padded - numel}  # fmt: skip
    return out


def diagrams(wrapped: nn.Module, ctx: RankContext) -> dict[str, dict[str, Any]]:
    """Each unit's flat parameter as guide 12's layout diagram reads it (`checks.guides.g12_flat_parameter`)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from checks.guides.g12_flat_parameter import real_layout
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
    ctx: RankContext, model: str, batch: str, *, wrap: dict[str, Any] | None, strategy: str, optimizer: str = "adamw",
    modes: tuple[str | None, ...] = ("BACKWARD_PRE", "BACKWARD_POST", None),
) -> dict[str, Any]:  # fmt: skip
    """The measurements `checks.inspect.compare` reads (see the module docstring)."""
    build, _ = loading.factory(model)
    make_batch, _ = loading.factory(batch, "--input")
    plain = loading.build_for_real(model, build).to(ctx.device)
    try:
        loss_of(call(plain, batch_of(make_batch, ctx, 0))).backward()
    except BatchRejected:
        raise
    except Exception as exc:
        raise BatchRejected(f"{model} rejected the batch of {batch}: {type(exc).__name__}: {exc}") from exc
    buffers = sum(b.numel() * b.element_size() for b in plain.buffers())
    del plain
    wrapped = _fsdp1(loading.build_for_real(model, build), ctx, wrap, strategy, "BACKWARD_PRE")
    out = {**steady_step(ctx, wrapped, make(optimizer, wrapped.parameters(), LR), make_batch), "prefetch": {}}
    out["buffers_unwrapped"] = buffers
    for mode in modes:
        wrapped = _fsdp1(loading.build_for_real(model, build), ctx, wrap, strategy, mode)
        output = call(wrapped, batch_of(make_batch, ctx, 0))
        order, _ = recorded_post_forward(wrapped)
        with record_events(wrapped, label=f"inspect {mode}") as events:
            loss_of(output).backward()
        out["prefetch"][str(mode)] = {
            "post_forward": order,
            "hooks": [e.describe() for e in events if e.kind in HOOK_KINDS],
        }
    out["gradients"] = gradients_against_ddp(ctx, model, build, make_batch, wrap=wrap, strategy=strategy)
    return out


def steady_step(ctx: RankContext, wrapped: nn.Module, optim: torch.optim.Optimizer,
                make_batch: Callable[[], Any]) -> dict[str, Any]:  # fmt: skip
    """What FSDP built (units, layout), the bytes a rank holds after one step with its gradients kept, and the
    collectives of the second step (lazy initialisation and the optimizer's state are the first's)."""

    def step(number: int) -> list[str]:
        output = call(wrapped, batch_of(make_batch, ctx, number))
        order, _ = recorded_post_forward(wrapped)
        loss_of(output).backward()
        optim.step()
        return order

    step(0)
    held = snapshot(wrapped, optim).by_category
    optim.zero_grad(set_to_none=True)
    with (
        record_comm() as comm,
        record_events(wrapped, label="inspect: the second step"),
        record_memory_series(wrapped, optim) as recorder,
    ):
        recorder.mark("start")
        order = step(1)
        recorder.mark("after step")
    return {
        "units": fsdp1_units(wrapped),
        "layout": _layout(wrapped),
        "diagrams": diagrams(wrapped, ctx),
        "series": {"bytes held over the second step": recorder.series.points},
        "memory": held,
        "collectives": [{"op": c.op, "numel": c.numel, "backward": c.in_backward} for c in comm],
        "ring_bytes": float(comm.ring_bytes()),
        "post_forward": [u for u in order if u != ROOT],
    }


def gradients_against_ddp(
    ctx: RankContext, spec: str, build: Callable[[], Any], make_batch: Callable[[], Any], *,
    wrap: dict[str, Any] | None, strategy: str,
) -> dict[str, Any]:  # fmt: skip
    """One backward of the same weights and batches under FSDP1 and under DDP: each parameter's reduced gradient,
    FSDP's gathered whole (``summon_full_params(with_grads=True)``), against DDP's: how many are bitwise equal,
    and the worst distance in ulps, with the parameter it is in."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(loading.build_for_real(spec, build).to(ctx.device))
    loss_of(call(ddp, batch_of(make_batch, ctx, 0))).backward()
    reference = {clean(n): p.grad.detach().clone() for n, p in ddp.module.named_parameters() if p.grad is not None}
    wrapped = _fsdp1(loading.build_for_real(spec, build), ctx, wrap, strategy, "BACKWARD_PRE")
    loss_of(call(wrapped, batch_of(make_batch, ctx, 0))).backward()
    with FSDP.summon_full_params(wrapped, writeback=False, with_grads=True):
        grads = {clean(n): p.grad.detach().clone() for n, p in wrapped.named_parameters() if p.grad is not None}
    missing = sorted(set(reference) ^ set(grads))
    distances = {name: _ulps(grads[name], reference[name]) for name in reference if name in grads}
    worst = max(distances, key=lambda n: distances[n]) if distances else None
    largest = max((float((grads[n] - reference[n]).abs().max()) for n in distances), default=0.0)
    return {
        "parameters": len(distances),
        "bitwise": sum(d == 0 for d in distances.values()),
        "worst_ulps": distances[worst] if worst else 0,
        "worst_parameter": worst if worst and distances[worst] else None,
        "largest_abs": largest,
        "missing": missing,
        "checksum": struct.unpack("<q", struct.pack("<d", float(sum(g.double().sum() for g in grads.values()))))[0],
    }
