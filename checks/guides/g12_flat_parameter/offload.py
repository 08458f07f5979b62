"""Guide 12's CPU offload claims: FSDP1's ``CPUOffload(offload_params=True)`` (it pins at lazy init, so without an
accelerator it raises; on CUDA the gradient lands in the pinned ``_cpu_grad``), ``summon_full_params(
offload_to_cpu=True)`` on a CPU compute device before and from torch 2.14.1, and FSDP2's ``CPUOffloadPolicy`` on a
cpu mesh. Expected values are a run without offload and the toy model's own parameters (`checks.workloads.toy`)."""

from __future__ import annotations

import traceback
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffload
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from checks.guides.g12_flat_parameter.flat_values import require_same_tensor
from checks.naming import clean
from checks.ranks.context import RankContext
from checks.violation import Violation, require, require_equal
from checks.workloads import toy

# What `pin_memory()` raises without an accelerator depends on the torch build, not on its version: the CPU wheel
# has no accelerator to ask for, a CUDA wheel finds no driver (measured: 2.13.0+cpu, 2.14.1+cu130).
NO_ACCELERATOR = (
    "Cannot access accelerator device when none is available",
    "Found no NVIDIA driver on your system",
)


def _no_accelerator(message: str) -> bool:
    return any(text in message for text in NO_ACCELERATOR)


def _fails_for_no_accelerator(call: Any, raised_in: str, ran: tuple[str, str]) -> dict[str, Any]:
    """``call()`` must raise one of the no-accelerator errors from a frame of ``raised_in``; ``ran`` is the
    (reason, message) of the violation when it does not raise at all."""
    try:
        call()
    except RuntimeError as error:
        message, frames = str(error), _frames(error)
    else:
        raise Violation(*ran)
    require(_no_accelerator(message), "wrong-offload-error", f"unexpected error: {message}", error=message)
    require(raised_in in frames, "raised-elsewhere", f"raised in {frames[-4:]}", frames=frames)
    return {"error": message, "raised_in": raised_in}


def _frames(error: BaseException) -> list[str]:
    return [frame.name for frame in traceback.extract_tb(error.__traceback__)]


def offload_params_needs_accelerator(ctx: RankContext) -> dict[str, Any]:
    """``CPUOffload(offload_params=True)`` pins the sharded flat parameter at lazy initialisation
    (``init_flat_param_attributes``); on a machine without an accelerator pinning raises, at the first forward."""
    model = toy.wrap_fsdp1(toy.toy_model(ctx.device), ctx, cpu_offload=CPUOffload(offload_params=True))
    handle = model._handle
    require_equal(str(handle.flat_param.device), "cpu", reason="not-offloaded", what="flat parameter's device")
    if torch.accelerator.is_available():  # the premise does not hold here: show the pinning instead
        model(toy.toy_batch(ctx)).sum().backward()
        require(handle.flat_param._local_shard.is_pinned(), "shard-not-pinned", "the local shard is not pinned")
        return {"error": None, "raised_in": None}
    ran = ("offload-ran-without-accelerator", "the first forward with offload_params=True ran on CPU")
    return _fails_for_no_accelerator(lambda: model(toy.toy_batch(ctx)), "init_flat_param_attributes", ran)


def offload_params_on_gpu(ctx: RankContext) -> dict[str, Any]:
    """On CUDA, ``offload_params=True``: the shard lives on CPU, pinned; the all-gather runs on the device; the
    reduced gradient shard is copied by `_offload_grad` into the pinned ``_cpu_grad``, which is the gradient the
    CPU optimizer sees; and those gradients equal a run without offload."""
    offloaded = toy.wrap_fsdp1(toy.toy_model(ctx.device), ctx, cpu_offload=CPUOffload(offload_params=True))
    plain = toy.wrap_fsdp1(toy.toy_model(ctx.device), ctx)
    x = toy.toy_batch(ctx)
    for model in (offloaded, plain):
        model(x).sum().backward()
    out: dict[str, Any] = {}
    for name, (a, b) in {"root": (offloaded, plain), "0": (offloaded[0], plain[0])}.items():
        fa, fb = a._handle.flat_param, b._handle.flat_param
        require_equal(str(fa.device), "cpu", reason="shard-not-on-cpu", what=f"{name}: sharded flat parameter")
        require(fa._local_shard.is_pinned(), "shard-not-pinned", f"{name}: local shard not pinned")
        require_equal(str(fa.grad.device), "cpu", reason="grad-not-on-cpu", what=f"{name}: gradient's device")
        require(fa._cpu_grad.is_pinned(), "grad-not-pinned", f"{name}: _cpu_grad not pinned")
        require_same_tensor(fa.grad, fb.grad.cpu(), reason="offloaded-grad-differs", what=f"{name}: gradient")
        out[name] = {"grad_device": str(fa.grad.device), "shard_numel": fa.numel()}
    return out


def _storage_bytes(tensor: torch.Tensor) -> int:
    """Bytes of the tensor's storage: metadata only, never its data (a 0-byte storage with elements segfaults)."""
    return tensor.untyped_storage().nbytes()


def summon_offload_frees_storage(ctx: RankContext, use_orig_params: bool) -> dict[str, Any]:
    """torch < 2.14.1, compute device CPU: ``summon_full_params(offload_to_cpu=True)`` goes through
    ``FlatParamHandle.to_cpu``, whose ``.to("cpu")`` is no copy, and then frees the storage it still views. With
    ``use_orig_params=True`` every original parameter inside the context has its full shape on a 0-byte storage
    (read only as metadata here: touching the data kills the rank); with ``writeback=False`` the shard survives.
    With ``use_orig_params=False`` unflattening the freed flat parameter raises ``setStorage: … out of bounds``."""
    model = toy.wrap_fsdp1(toy.toy_model(ctx.device), ctx, use_orig_params=use_orig_params)
    with torch.no_grad():
        model(toy.toy_batch(ctx))  # lazy init
    before = model._handle.flat_param.detach().clone()
    if not use_orig_params:
        try:
            with FSDP.summon_full_params(model, offload_to_cpu=True, writeback=False):
                pass
        except RuntimeError as error:
            message, frames = str(error), _frames(error)
        else:
            raise Violation("no-setstorage-error", "summon_full_params(offload_to_cpu=True) did not raise")
        ok = "setStorage" in message and "out of bounds for storage of size 0" in message
        require(ok, "wrong-summon-error", f"unexpected error: {message}", error=message)
        return {"error": message.partition(" requiring")[0], "raised_in": frames[-3:]}
    with FSDP.summon_full_params(model, offload_to_cpu=True, writeback=False):
        numels = {clean(n): p.numel() for n, p in model.named_parameters()}
        storage = {clean(n): _storage_bytes(p) for n, p in model.named_parameters()}
        flat_bytes = _storage_bytes(model._handle.flat_param)
    full = {clean(n): p.numel() for n, p in toy.toy_model(ctx.device).named_parameters()}
    require_equal(numels, full, reason="not-unsharded", what="numel of each parameter inside the context")
    require_equal(storage, dict.fromkeys(storage, 0), reason="storage-kept", what="storage bytes inside the context")
    require_same_tensor(model._handle.flat_param, before, reason="shard-changed", what="local shard after the context")
    return {"storage_bytes": storage, "numel": numels, "flat_param_bytes": flat_bytes}


def summon_offload_is_a_no_op(ctx: RankContext) -> dict[str, Any]:
    """torch >= 2.14.1: ``to_cpu`` does nothing when the flat parameter is already on the CPU, so
    ``summon_full_params(offload_to_cpu=True)`` on a CPU gives the full parameters with their storage and values,
    with and without ``use_orig_params``, and the default ``writeback=True`` leaves every shard as it was."""
    out = {}
    for use_orig_params in (False, True):
        model = toy.wrap_fsdp1(toy.toy_model(ctx.device), ctx, use_orig_params=use_orig_params)
        with torch.no_grad():
            model(toy.toy_batch(ctx))
        before = model._handle.flat_param.detach().clone()
        full = {clean(n): p for n, p in toy.toy_model(ctx.device).named_parameters()}
        with FSDP.summon_full_params(model, offload_to_cpu=True):
            storage = {clean(n): _storage_bytes(p) for n, p in model.named_parameters()}
            short = sorted(n for n, size in storage.items() if size < 4 * full[n].numel())  # views share a storage
            require_equal(
                short, [], reason="storage-freed", what="parameters whose storage cannot hold them", storage=storage
            )
            for n, p in model.named_parameters():
                require_same_tensor(p, full[clean(n)].detach(), reason="unsharded-param-differs", what=clean(n))
        require_same_tensor(model._handle.flat_param, before, reason="shard-changed", what="shard after the context")
        out["orig" if use_orig_params else "flat"] = storage
    return out


# -- FSDP2 offload ---------------------------------------------------------------------------------------------------
def _fsdp2_params(model: nn.Module) -> list[Any]:
    """Every ``FSDPParam`` of an FSDP2 model, module by module."""
    found = []
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        group = get_state()._fsdp_param_group if get_state is not None else None
        if group is not None:
            found.extend(group.fsdp_params)
    return found


def fsdp2_offload(ctx: RankContext, pin_memory: bool) -> dict[str, Any]:
    """FSDP2 ``CPUOffloadPolicy`` on a cpu mesh. ``pin_memory=False``: the policy reaches every ``FSDPParam``
    (``offload_to_cpu`` on, ``pin_memory`` off), no sharded parameter or gradient is pinned, and one backward's
    sharded gradients equal a run without offload. The compute device is the CPU here, so the copies offload
    adds are no-ops and where the tensors live proves nothing; the flags and the pinning are what can differ.
    ``pin_memory=True`` (the default): ``fully_shard`` pins each sharded parameter and, without an accelerator,
    raises at once."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    policy = CPUOffloadPolicy(pin_memory=pin_memory)
    if pin_memory and not torch.accelerator.is_available():
        ran = ("pinned-offload-ran", "fully_shard with CPUOffloadPolicy() ran without an accelerator")
        build = lambda: toy.wrap_fsdp2(toy.toy_model(ctx.device), ctx, offload_policy=policy)  # noqa: E731
        return _fails_for_no_accelerator(build, "_init_sharded_param", ran)
    x = toy.toy_batch(ctx)
    grads, seen = {}, {}
    for label, kwargs in (("offload", {"offload_policy": policy}), ("plain", {})):
        model = toy.wrap_fsdp2(toy.toy_model(ctx.device), ctx, **kwargs)
        model(x).sum().backward()
        grads[label] = {clean(n): p.grad.to_local().detach() for n, p in model.named_parameters()}
        seen[label] = {
            "flags": [list(f) for f in sorted({(p.offload_to_cpu, p.pin_memory) for p in _fsdp2_params(model)})],
            "devices": sorted({p.to_local().device.type for p in model.parameters()}),
            "pinned": sorted({p.to_local().is_pinned() for p in model.parameters()}),
            "grads_pinned": sorted({g.is_pinned() for g in grads[label].values()}),
        }
    want = {"offload": [[True, pin_memory]], "plain": [[False, False]]}
    flags = {label: seen[label]["flags"] for label in seen}
    require_equal(flags, want, reason="policy-not-applied", what="(offload_to_cpu, pin_memory) of every FSDPParam")
    offload = seen["offload"]
    require_equal(offload["devices"], ["cpu"], reason="not-on-cpu", what="devices of the sharded parameters")
    pinned = {"parameters": offload["pinned"], "gradients": offload["grads_pinned"]}
    want_pinned = {"parameters": [pin_memory], "gradients": [False]}  # on a cpu mesh no gradient is copied, so pinned
    require_equal(pinned, want_pinned, reason="pinned", what="is_pinned() of the sharded parameters and gradients")
    for name, grad in grads["offload"].items():
        require_same_tensor(grad, grads["plain"][name].cpu(), reason="offloaded-grad-differs", what=f"{name} gradient")
    return {**offload, "parameters": len(grads["offload"])}
