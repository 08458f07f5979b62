"""Choose the backend and devices for a world size: gloo on CPU unless there is one CUDA device per rank."""

from __future__ import annotations

import functools

BACKENDS = ("auto", "gloo", "nccl")


@functools.cache
def cuda_device_count() -> int:
    import torch  # only a session that runs checks pays for this import

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve(requested: str, world_size: int) -> str:
    """``auto`` is nccl with at least ``world_size`` GPUs, else gloo."""
    if requested not in BACKENDS:
        raise ValueError(f"unknown backend {requested!r}; choose one of {', '.join(BACKENDS)}")
    if requested == "auto":
        return "nccl" if cuda_device_count() >= world_size else "gloo"
    return requested


def unavailable(backend: str, world_size: int) -> str | None:
    """Why ``backend`` cannot run ``world_size`` ranks here, or None."""
    if backend == "nccl":
        count = cuda_device_count()
        if count < world_size:
            return f"nccl needs one CUDA device per rank: {world_size} ranks, {count} CUDA device(s) here"
    return None


def missing_gpus(world_size: int) -> str | None:
    """Why a claim marked ``gpu`` cannot run on ``world_size`` ranks here (one CUDA device each), or None. pytest's
    item setup and the study commands skip with these words."""
    have = cuda_device_count()
    if have < world_size:
        return f"needs {world_size} CUDA device(s) for nccl (one per rank); {have} here"
    return None
