"""Keep one check from leaking into the next on a reused rank.

Before a check: reseed every RNG. After it: restore torch's global switches, destroy the process groups the check
created, and collect garbage so FSDP/DDP objects (and their hooks on autograd) are gone.

The collection after each check scans only what the checks made: torch's import graph is frozen out of the
collector's sight when the rank starts (`freeze_baseline`), and what survives each collection (modules a check
imported, caches) joins it. A survivor that becomes garbage later (a cache a later check empties) waits for the
full collection every `SWEEP_EVERY` checks.
"""

from __future__ import annotations

import gc
import itertools
import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d


@dataclass(frozen=True)
class GlobalState:
    default_dtype: torch.dtype
    grad_enabled: bool
    deterministic: bool
    num_threads: int
    anomaly: bool


def snapshot() -> GlobalState:
    return GlobalState(
        default_dtype=torch.get_default_dtype(),
        grad_enabled=torch.is_grad_enabled(),
        deterministic=torch.are_deterministic_algorithms_enabled(),
        num_threads=torch.get_num_threads(),
        anomaly=torch.is_anomaly_enabled(),
    )


def restore(state: GlobalState) -> None:
    """Put back what changed (only what changed: some setters cost a lazy import on first call)."""
    now = snapshot()
    if now.default_dtype != state.default_dtype:
        torch.set_default_dtype(state.default_dtype)
    if now.grad_enabled != state.grad_enabled:
        torch.set_grad_enabled(state.grad_enabled)
    if now.deterministic != state.deterministic:
        torch.use_deterministic_algorithms(state.deterministic)
    if now.num_threads != state.num_threads:
        torch.set_num_threads(state.num_threads)
    if now.anomaly != state.anomaly:
        torch.autograd.set_detect_anomaly(state.anomaly)


def reseed(seed: int) -> None:
    """Same seed on every rank: checks that need rank-dependent data derive it from ``ctx.rank``."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device too


def live_groups() -> set[dist.ProcessGroup]:
    return set(c10d._world.pg_map)


def destroy_groups_created_since(before: set[dist.ProcessGroup]) -> None:
    """Destroy subgroups (new_group, device meshes) a check made; the world group stays."""
    for group in live_groups() - before:
        if group is not c10d._get_default_group():
            dist.destroy_process_group(group)
    # DeviceMesh keeps meshes (and their groups) in a private registry whose fields change across releases; a
    # stale entry would hand the next check a destroyed group, so empty every container it holds.
    mesh_resources = getattr(torch.distributed.device_mesh, "_mesh_resources", None)
    for cache in vars(mesh_resources).values() if mesh_resources is not None else ():
        if isinstance(cache, list | dict | set):
            cache.clear()


def freeze_baseline() -> None:
    """Move every object alive now (torch's import graph) out of the collector's sight, so the full collection
    after each check scans only what checks created, not the whole of torch."""
    gc.collect()
    gc.freeze()


SWEEP_EVERY = 50
_collections = itertools.count(1)


def collect() -> None:
    if next(_collections) % SWEEP_EVERY == 0:
        gc.unfreeze()
    gc.collect()
    gc.freeze()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def live_objects() -> list[object]:
    """Every object the collector tracks that is reachable now, frozen ones included (after a full
    collection)."""
    gc.unfreeze()
    gc.collect()
    try:
        return gc.get_objects()
    finally:
        gc.freeze()
