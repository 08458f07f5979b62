"""What a rank should hold, never read from FSDP: an unwrapped replica's values sliced at the spec's rows
(`checks.models.fsdp2_shards`), padded with zeros to the spec's chunk; and the byte-for-byte comparison every
claim makes against them."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from checks.models import fsdp2_shards as spec
from checks.violation import Violation


def expected_rows(replica: nn.Module, fqn: str, shape: tuple[int, ...], n: int, rank: int) -> torch.Tensor:
    """The rank's rows of the replica's parameter, as the spec places them (rules 1 and 2)."""
    start, stop = spec.row_range(shape, n, rank)
    value = replica.get_parameter(fqn).detach()
    return value[start:stop].reshape(spec.local_shape(shape, n, rank))


def expected_padded(replica: nn.Module, fqn: str, shape: tuple[int, ...], n: int, rank: int) -> torch.Tensor:
    """Rule 3: the rank's rows flattened, then zeros up to the padded chunk."""
    rows = expected_rows(replica, fqn, shape, n, rank).reshape(-1)
    padded = torch.zeros(spec.padded_shard_numel(shape, n), dtype=rows.dtype)
    padded[: rows.numel()] = rows
    return padded


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, 1-D: what the all-gather moves, whatever the dtype."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def require_same(observed: torch.Tensor, expected: torch.Tensor, *, reason: str, what: str, **details: Any) -> None:
    """Same shape, dtype and bits, or a `Violation` naming the first byte that differs."""
    observed = observed.detach().cpu()
    same_meta = observed.shape == expected.shape and observed.dtype == expected.dtype
    if same_meta and torch.equal(as_bytes(observed), as_bytes(expected)):
        return
    info: dict[str, Any] = {
        "observed_shape": list(observed.shape),
        "expected_shape": list(expected.shape),
        "observed_dtype": str(observed.dtype),
        "expected_dtype": str(expected.dtype),
    }
    if same_meta:
        info["byte"] = int((as_bytes(observed) != as_bytes(expected)).nonzero()[0])
    raise Violation(reason, f"{what} differs: {info}", what=what, **info, **details)
