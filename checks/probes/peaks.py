"""Peak memory per category over a block, from torch's own trackers; and CUDA allocator statistics on GPU.

torch ships two trackers in the private package ``torch.distributed._tools`` (present in 2.13): ``MemTracker``
(any model: parameters, gradients, optimizer state, activations, temporaries, buffers) and ``FSDPMemTracker`` (an
FSDP2 root: sharded / unsharded parameters and gradients, all-gather and reduce-scatter buffers). Both are
``TorchDispatchMode``\\ s that follow every storage created in the block, plus storage resizes. Both only report
the breakdown at the moment of the *total* peak; `PeakTracker` also keeps the running maximum of each category,
which is what "peak unsharded bytes" means.

FSDP1 allocates and frees its unsharded flat parameter by resizing a storage created at wrap time, and during
forward that storage is also the FlatParameter's data, which ``MemTracker`` files under "Parameter". The tracker
here is told about those buffers beforehand and keeps them under "unsharded", so FSDP1's parameter peak is its
shards and its unsharded peak is the unsharded flat parameters.

When the trackers are missing (another torch) or their private hooks changed, `PeakTracker.unavailable` says so and
no peak is reported: never a silent zero.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

# torch tracker category -> our category
_NAMES = {
    "Parameter": "params",
    "Sharded Param": "params",
    "Gradient": "grads",
    "Sharded Grad": "grads",
    "Optstate": "optim",
    "OptState": "optim",
    "Other": "unsharded",  # only FSDP1's unsharded flat parameters are registered as external tensors
    "Unsharded Param": "unsharded",
    "All Gather": "all_gather",
    "Unsharded Grad": "unsharded_grads",
    "Reduce Scatter": "reduce_scatter",
    "Activation": "activations",
    "Temp": "temp",
    "Buffer": "buffers",
    "Inputs": "inputs",
    "Total": "total",
}


@dataclass
class PeakReport:
    tracker: str  # "MemTracker" | "FSDPMemTracker"
    peak: dict[str, int] = field(default_factory=dict)  # running maximum of each category (and "total")
    at_total_peak: dict[str, int] = field(default_factory=dict)  # the breakdown when the total peaked
    notes: list[str] = field(default_factory=list)


@dataclass
class CudaStats:
    device: str
    allocated_before: int
    allocated_after: int
    peak_allocated: int  # over the block (peak stats are reset on entry)
    reserved_after: int
    peak_reserved: int


def _key(name: Any) -> str:
    raw = getattr(name, "value", name)
    return _NAMES.get(str(raw), str(raw))


class PeakTracker:
    """Context manager over torch's memory tracker; `report` after exit."""

    def __init__(
        self,
        model: nn.Module,
        optim: torch.optim.Optimizer | None,
        unsharded: Callable[[], list[torch.Tensor]] = list,
    ) -> None:
        """``unsharded``: returns FSDP1's unsharded flat buffers as they are now (they appear at lazy init)."""
        self.unavailable: str | None = None
        self._running: dict[str, int] = {}
        self._keys: dict[Any, str] = {}  # torch's category -> ours, as met (after every operator: kept)
        self._notes: list[str] = []
        self._tracker: Any = None
        self._name = ""
        self._root = model
        self._reset_handle: Any = None
        try:
            self._tracker = self._build(model, optim, unsharded)
        except (ImportError, AttributeError, AssertionError, TypeError) as exc:
            self.unavailable = (
                f"torch {torch.__version__}: torch.distributed._tools memory trackers unavailable here ({exc!r}); "
                "no peaks are reported"
            )

    @property
    def available(self) -> bool:
        return self._tracker is not None

    def _build(
        self, model: nn.Module, optim: torch.optim.Optimizer | None, unsharded: Callable[[], list[torch.Tensor]]
    ) -> Any:
        from torch.distributed._tools.mem_tracker import _TOTAL_KEY
        from torch.distributed.fsdp import FSDPModule

        class _GlobalPeakOnly:
            """Skip the per-module peak snapshots torch updates on every operator (unused here, and half the
            trackers' cost); keep the global peak."""

            _curr_mem_snap: dict[Any, dict[str, int]]
            _peak_mem: dict[Any, int]
            _peak_mem_snap: dict[Any, dict[str, int]]

            def _update_peak_stats(self, peak_state: Any) -> None:
                for device, device_snapshot in self._curr_mem_snap.items():
                    if self._peak_mem.get(device, 0) < device_snapshot[_TOTAL_KEY]:
                        self._peak_mem[device] = device_snapshot[_TOTAL_KEY]
                        self._peak_mem_snap[device] = dict(device_snapshot)

        if isinstance(model, FSDPModule):
            from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

            class _FSDPTracker(_GlobalPeakOnly, FSDPMemTracker):
                pass

            tracker = _FSDPTracker(model, optim)
            self._name = "FSDPMemTracker"
        else:
            from torch.distributed._tools.common_utils import get_untyped_storages
            from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

            cached: dict[tuple[int, ...], frozenset[int]] = {}

            def pinned(t: torch.Tensor) -> bool:
                # Called for every tensor every operator touches: the buffers' storage keys are worked out once
                # per set of buffers (they appear at lazy init, then only resize), and a plain tensor is one
                # storage.
                buffers = unsharded()
                ids = tuple(id(b) for b in buffers)
                keys = cached.get(ids)
                if keys is None:
                    cached.clear()
                    keys = cached[ids] = frozenset(st._cdata for b in buffers for st in get_untyped_storages(b))
                if not keys:
                    return False
                if type(t) is torch.Tensor or type(t) is nn.Parameter:
                    return t.untyped_storage()._cdata in keys
                return any(st._cdata in keys for st in get_untyped_storages(t))

            class _Tracker(_GlobalPeakOnly, MemTracker):
                """MemTracker that files FSDP1's unsharded flat buffers under "Other" whoever reaches them."""

                def _update_and_maybe_create_winfos(self, t: Any, reftype: Any, update_existing: bool = False) -> Any:
                    return super()._update_and_maybe_create_winfos(
                        t, _MemRefType.OTH if pinned(t) else reftype, update_existing
                    )

                def _track(self, reftype: Any, t: torch.Tensor) -> None:
                    super()._track(_MemRefType.OTH if pinned(t) else reftype, t)

                def _track_module_params_and_buffers(self, module: nn.Module, install_grad_hooks: bool = True) -> Any:
                    # FSDP1 with use_orig_params swaps leaf parameters for views of the flat parameter during
                    # forward; gradient hooks cannot be registered on views (torch's tracker would raise).
                    leaves = all(p.is_leaf for p in module.parameters())
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", UserWarning)  # it reads .grad of those views
                        return super()._track_module_params_and_buffers(module, install_grad_hooks and leaves)

            tracker = _Tracker()
            self._name = "MemTracker"
            tracker.track_external(model, *([optim] if optim is not None else []), *unsharded())
            if _has_fsdp1(model):
                self._notes.append("FSDP1 unsharded flat parameters tracked as 'unsharded' (torch: 'Other')")
                self._notes.append(
                    "FSDP1 gradients: the tracker files gradients it meets through parameter hooks; FSDP1's sharded "
                    "gradients come from reduce-scatter outputs and count as 'temp' there: read grads from snapshots"
                )
        original = tracker._update_snap  # private: fails here, not silently later, if torch renamed it

        def update_snap(*args: Any, **kwargs: Any) -> None:
            original(*args, **kwargs)
            self._observe()

        tracker._update_snap = update_snap
        return tracker

    def _observe(self) -> None:
        running, keys = self._running, self._keys
        for device_snapshot in self._tracker._curr_mem_snap.values():
            for name, value in device_snapshot.items():
                key = keys.get(name)
                if key is None:
                    key = keys[name] = _key(name)
                if value > running.get(key, 0):
                    running[key] = value

    def __enter__(self) -> PeakTracker:
        # torch's trackers refuse a second root forward in one block ("multiple iterative calls") because of the
        # per-module statistics they keep; those are unused here, so reset them when the root's next forward
        # starts. A global hook registered before the tracker's own runs before it.
        self._reset_handle = nn.modules.module.register_module_forward_pre_hook(self._new_iteration)
        self._tracker.__enter__()
        self._observe()  # what was already there counts as the starting level
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._tracker.__exit__(*exc)
        finally:
            self._reset_handle.remove()

    def _new_iteration(self, module: nn.Module, args: Any) -> None:
        if module is self._root and module in self._tracker.memory_tracking:
            self._tracker.reset_mod_stats()

    def report(self) -> PeakReport:
        at_peak: dict[str, int] = {}
        for device_snapshot in self._tracker.get_tracker_snapshot("peak").values():
            for name, value in device_snapshot.items():
                at_peak[_key(name)] = at_peak.get(_key(name), 0) + value
        return PeakReport(self._name, dict(self._running), at_peak, list(self._notes))


def _has_fsdp1(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return any(isinstance(m, FullyShardedDataParallel) for m in model.modules())


class CudaWatch:
    """CUDA caching-allocator statistics over a block, on a CUDA device; on CPU, ``unavailable`` says why."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stats: CudaStats | None = None
        self.unavailable: str | None = None
        if device.type != "cuda":
            self.unavailable = (
                f"CUDA allocator stats need a CUDA device; this rank's model is on {device} "
                f"(torch.cuda.is_available() = {torch.cuda.is_available()})"
            )
        self._before = 0

    def __enter__(self) -> CudaWatch:
        if self.unavailable is None:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._before = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.unavailable is None:
            torch.cuda.synchronize(self.device)
            self.stats = CudaStats(
                device=str(self.device),
                allocated_before=self._before,
                allocated_after=torch.cuda.memory_allocated(self.device),
                peak_allocated=torch.cuda.max_memory_allocated(self.device),
                reserved_after=torch.cuda.memory_reserved(self.device),
                peak_reserved=torch.cuda.max_memory_reserved(self.device),
            )
