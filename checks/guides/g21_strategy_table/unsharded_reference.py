"""What the tensor-parallel and 2D checks hold a sharded block to: the unsharded block's tensors, a rank's
``torch.chunk`` of one, and how far apart two are, relative to a scale that rounding noise cannot shrink."""

from __future__ import annotations

import torch

from checks.violation import require

LR = 0.1  # SGD: AdamW would turn the key bias's rounding-noise gradient into full-size steps (m/√v)


def chunk_of(full: torch.Tensor, placement: str, rank: int, world_size: int) -> torch.Tensor:
    """This rank's ``torch.chunk`` of ``full`` along a ``Shard(dim=d)`` placement (as its repr reads); all of it
    when replicated."""
    if placement.startswith("Shard"):
        dim = int(placement.split("dim=")[1].rstrip(")"))
        return full.chunk(world_size, dim=dim)[rank]
    return full


def full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole tensor; a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _relative_errors(pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """Each tensor's largest element difference, relative to its own largest magnitude; a gradient's relative to
    the largest gradient element of the whole block, since some gradients are zero but for rounding (a key's bias:
    softmax ignores a constant added to every score of a row)."""
    grad_scale = max((float(w.abs().max()) for k, (_, w) in pairs.items() if k.endswith(".grad")), default=0.0)
    out = {}
    for what, (got, want) in pairs.items():
        scale = grad_scale if what.endswith(".grad") else float(want.abs().max())
        out[what] = float((got.double() - want.double()).abs().max()) / scale
    return out


def require_close(pairs: dict[str, tuple[torch.Tensor, torch.Tensor]], tolerance: float, step: int,
                  worst: dict[str, float]) -> None:  # fmt: skip
    """Every (sharded, unsharded) pair within ``tolerance`` of its scale; ``worst`` keeps each tensor's largest."""
    for what, error in _relative_errors(pairs).items():
        worst[what] = max(worst.get(what, 0.0), error)
        require(error <= tolerance, "not-equivalent", f"step {step}: {what} differs from the unsharded block's by "
                f"{error:.3g} of its scale", step=step, what=what, error=error, tolerance=tolerance)  # fmt: skip
