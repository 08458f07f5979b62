"""Per-rank memory by category, counted from distinct live storages: ``with account_memory(model, optim) as mem:``.

A snapshot walks what the model and optimizer hold and counts each *storage* once, with the bytes it holds now:

- ``unsharded``: FSDP1's padded unsharded flat parameter (``_full_param_padded``, and its full-precision twin under
  mixed precision); FSDP2's all-gather outputs, unsharded parameters, post-forward-mesh copies and the all-gather
  buffer kept for overlap. Collected first, so parameters that are views of them are not counted again.
- ``params``: FSDP1 local shards (``_local_shard``; the flat parameter itself under NO_SHARD) and low-precision
  shards; FSDP2 sharded parameter data; then every ``model.parameters()`` (DTensors by their ``_local_tensor``).
- ``grads``: ``.grad`` of every parameter (and of FSDP1 flat parameters), FSDP1's ``_saved_grad_shard`` and CPU
  offload ``_cpu_grad``, FSDP2's unsharded accumulated gradients.
- ``optim``: every tensor in the optimizer's state (ZeroRedundancyOptimizer: its local optimizer's), step counters
  included (fp32 Adam: 8 bytes per element plus a 4-byte ``step`` per parameter tensor; `MemorySnapshot.nbytes`
  can leave scalars out).
- ``buffers``: module buffers.

Rules: DTensors count their local tensor; a storage FSDP freed (resized to 0) counts 0 bytes; a storage reached
twice (a view of a flat parameter, a gradient view into a flat gradient) counts once, in the first category that
reached it. So sharded categories come out as exact 1/N fractions of DDP's where the sizes divide by N.

Peaks over the block come from torch's memory trackers (`checks.probes.peaks`) when available, and CUDA allocator
statistics on GPU.

Blind spots: anything that is not reachable from the model or the optimizer. DDP's reducer buckets (C++; as big
as the gradients), activations and autograd's saved tensors, communication buffers inside the backend, the
caching allocator's reserved-but-unused blocks, and temporaries — those show only in the peaks, if at all. RSS is
deliberately not used: it is too coarse for models this size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from checks.naming import clean, unit_name
from checks.probes import peaks as peak_tools
from checks.probes.peaks import CudaStats, PeakReport

CATEGORIES: tuple[str, ...] = ("params", "grads", "optim", "unsharded", "buffers")


@dataclass(frozen=True)
class StorageEntry:
    category: str
    label: str  # what reached it first, e.g. "1.weight.grad", "optim 1.weight exp_avg", "fsdp1 (root) local shard"
    nbytes: int
    dtype: str
    scalar: bool = False  # a 0-dim tensor (Adam's ``step``)


@dataclass
class MemorySnapshot:
    """Bytes held by distinct live storages, per category, on one rank."""

    rank: int = -1
    entries: list[StorageEntry] = field(default_factory=list)

    @property
    def by_category(self) -> dict[str, int]:
        return {c: self.nbytes(c) for c in CATEGORIES}

    @property
    def total(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def nbytes(self, category: str | None = None, *, scalars: bool = True) -> int:
        return sum(
            e.nbytes for e in self.entries if (category is None or e.category == category) and (scalars or not e.scalar)
        )

    def fraction_of(self, other: MemorySnapshot, category: str, *, scalars: bool = True) -> Fraction:
        """This snapshot's bytes in ``category`` over ``other``'s, exactly (e.g. FSDP over DDP)."""
        return Fraction(self.nbytes(category, scalars=scalars), other.nbytes(category, scalars=scalars))


# -- what a model and an optimizer hold ----------------------------------------------------------------------------
def _fsdp1_tensors(modules: list[tuple[str, nn.Module]], names: dict[int, str]) -> Iterator[tuple[str, str, Any]]:
    from torch.distributed.fsdp import FullyShardedDataParallel

    for fqn, module in modules:
        if not isinstance(module, FullyShardedDataParallel) or module._handle is None:
            continue
        flat = module._handle.flat_param
        unit = unit_name(fqn)
        for attr in ("_full_param_padded", "_full_prec_full_param_padded"):
            yield "unsharded", f"fsdp1 {unit} {attr}", getattr(flat, attr, None)
        yield "params", f"fsdp1 {unit} local shard", getattr(flat, "_local_shard", None)
        yield "params", f"fsdp1 {unit} flat param", flat
        yield "params", f"fsdp1 {unit} low-precision shard", getattr(flat, "_mp_shard", None)
        yield "grads", f"fsdp1 {unit} flat grad", flat.grad
        yield "grads", f"fsdp1 {unit} saved grad shard", getattr(flat, "_saved_grad_shard", None)
        yield "grads", f"fsdp1 {unit} cpu grad", getattr(flat, "_cpu_grad", None)
        names.setdefault(id(flat), f"fsdp1 {unit} flat param")


def _fsdp2_tensors(modules: list[tuple[str, nn.Module]]) -> Iterator[tuple[str, str, Any]]:
    from torch.distributed.fsdp import FSDPModule

    for _, module in modules:
        if not isinstance(module, FSDPModule):
            continue
        for group in module._get_fsdp_state()._fsdp_param_groups:
            results = [group._all_gather_result]
            kept = getattr(group.comm_ctx, "all_gather_state", None)
            results.append(kept.all_gather_result if kept is not None else None)
            for result in results:
                if result is not None:
                    yield (
                        "unsharded",
                        f"fsdp2 {unit_name(group._module_fqn)} all-gather buffer",
                        result.all_gather_output,
                    )
            for param in group.fsdp_params:
                name = param._param_fqn or "?"
                for output in getattr(param, "all_gather_outputs", None) or []:
                    yield "unsharded", f"fsdp2 {name} all-gather output", output
                yield "unsharded", f"fsdp2 {name} unsharded", getattr(param, "_unsharded_param", None)
                yield (
                    "unsharded",
                    f"fsdp2 {name} post-forward",
                    getattr(param, "_sharded_post_forward_param_data", None),
                )
                yield "params", f"fsdp2 {name} sharded data", getattr(param, "_sharded_param_data", None)
                yield "grads", f"fsdp2 {name} accumulated grad", getattr(param, "unsharded_accumulated_grad", None)


def _optimizers(optim: torch.optim.Optimizer | None) -> list[torch.optim.Optimizer]:
    out: list[torch.optim.Optimizer] = []
    while isinstance(optim, torch.optim.Optimizer) and all(optim is not o for o in out):
        out.append(optim)
        optim = getattr(optim, "optim", None)  # ZeroRedundancyOptimizer keeps its local shard's optimizer here
    return out


def _named_members(modules: list[tuple[str, nn.Module]], attribute: str) -> list[tuple[str, torch.Tensor]]:
    """What ``named_parameters()`` / ``named_buffers()`` give (each tensor once, under its first name), from a
    walk of the modules done once: a snapshot needs both, and each walk of a deep model costs."""
    seen: set[int] = set()
    out: list[tuple[str, torch.Tensor]] = []
    for prefix, module in modules:
        for name, value in getattr(module, attribute).items():
            if value is None or id(value) in seen:
                continue
            seen.add(id(value))
            out.append((f"{prefix}.{name}" if prefix else name, value))
    return out


def held_tensors(model: nn.Module, optim: torch.optim.Optimizer | None) -> Iterator[tuple[str, str, Any]]:
    """(category, label, value) of every tensor the model and optimizer hold, as the account counts them; a check
    whose implementation holds more (a reference ZeRO's shards and masters) adds its own to these."""
    modules = list(model.named_modules())
    named = _named_members(modules, "_parameters")
    names = {id(p): clean(n) for n, p in named}
    yield from _fsdp1_tensors(modules, names)
    yield from _fsdp2_tensors(modules)
    parameters = [p for _, p in named]
    for p in parameters:
        yield "params", names.get(id(p), "?"), p
    for p in parameters:
        # Inside FSDP a module's `_parameters` can hold plain tensors, views computed from the flat parameter (not
        # leaves): autograd keeps no `.grad` on those unless asked, and reading it would only warn.
        grad = p.grad if p.is_leaf or p.retains_grad else None
        yield "grads", f"{names.get(id(p), '?')}.grad", grad
    for optimizer in _optimizers(optim):
        for param, state in optimizer.state.items():
            for key, value in state.items() if isinstance(state, dict) else ():
                yield "optim", f"optim {names.get(id(param), '?')} {key}", value
        for bucket in getattr(optimizer, "_buckets", None) or []:  # ZeRO's parameters_as_bucket_view
            yield "params", "zero bucket", bucket
    for fqn, buffer in _named_members(modules, "_buffers"):
        yield "buffers", fqn, buffer


def plain_tensors(value: Any) -> Iterator[torch.Tensor]:
    """Plain tensors behind a value: a DTensor's local tensor, a wrapper subclass's inner tensors."""
    if isinstance(value, list | tuple):
        for item in value:
            yield from plain_tensors(item)
    elif isinstance(value, torch.Tensor):
        if is_traceable_wrapper_subclass(value):
            attrs, _ = value.__tensor_flatten__()
            for attr in attrs:
                yield from plain_tensors(getattr(value, attr))
        else:
            yield value


def snapshot(model: nn.Module, optim: torch.optim.Optimizer | None = None) -> MemorySnapshot:
    """Bytes per category on this rank now (see the module docstring for the rules)."""
    seen: set[int] = set()
    entries: list[StorageEntry] = []
    for category, label, value in held_tensors(model, optim):
        for tensor in plain_tensors(value):
            if tensor.device.type == "meta":
                continue
            storage = tensor.untyped_storage()
            key = storage._cdata
            if key in seen:
                continue
            seen.add(key)
            entries.append(StorageEntry(category, label, storage.nbytes(), str(tensor.dtype), tensor.dim() == 0))
    return MemorySnapshot(rank=dist.get_rank() if dist.is_initialized() else 0, entries=entries)


# -- the accountant ------------------------------------------------------------------------------------------------
@dataclass
class MemoryAccount:
    """What `account_memory` measured on one rank: snapshots at entry and exit, peaks, CUDA allocator stats."""

    before: MemorySnapshot
    after: MemorySnapshot | None = None
    peak: PeakReport | None = None
    peak_unavailable: str | None = None
    cuda: CudaStats | None = None
    cuda_unavailable: str | None = None


@contextmanager
def account_memory(
    model: nn.Module, optim: torch.optim.Optimizer | None = None, *, peaks: bool = False
) -> Iterator[MemoryAccount]:
    """Snapshot at entry and exit; with ``peaks``, peaks per category over the block from torch's trackers where
    available (``mem.peak``, else ``mem.peak_unavailable`` says why); CUDA allocator stats on GPU (else
    ``mem.cuda_unavailable`` says why). Peaks are opt-in: torch's memory tracker intercepts every operator and
    costs more than the step it watches, so only a check that reads a peak should pay for it."""
    account = MemoryAccount(before=snapshot(model, optim))
    tracker = peak_tools.PeakTracker(model, optim, _unsharded_buffers(model)) if peaks else None
    if tracker is not None:
        account.peak_unavailable = tracker.unavailable
    cuda = peak_tools.CudaWatch(_device_of(model))
    account.cuda_unavailable = cuda.unavailable
    with cuda, tracker if tracker is not None and tracker.available else _nothing():
        yield account
    account.after = snapshot(model, optim)
    account.cuda = cuda.stats
    if tracker is not None and tracker.available:
        account.peak = tracker.report()
    elif not peaks:
        account.peak_unavailable = "peaks=False"


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _unsharded_buffers(model: nn.Module) -> Callable[[], list[torch.Tensor]]:
    """FSDP1's unsharded flat buffers, as they are when called: created at lazy init (the first forward), then
    allocated and freed by resizing their storage, so a tracker must recognise them whenever it meets them."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    flats = [m._handle.flat_param for m in model.modules() if isinstance(m, FullyShardedDataParallel) and m._handle]

    def buffers() -> list[torch.Tensor]:
        return [
            buffer
            for flat in flats
            for attr in ("_full_param_padded", "_full_prec_full_param_padded")
            if (buffer := getattr(flat, attr, None)) is not None
        ]

    return buffers


def _device_of(model: nn.Module) -> torch.device:
    for leaf in plain_tensors(list(model.parameters())):
        return leaf.device
    return torch.device("cpu")
