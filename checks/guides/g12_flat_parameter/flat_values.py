"""What a flat parameter should hold, by value: the spec's layout filled from an unwrapped replica (42 in its
padding, 0 in the padding sharding adds), an exact tensor comparison that names the first element that differs,
and a rank's shard and sharded views compared with their slice. Shared by the property claims and the
summon_full_params claims."""

from __future__ import annotations

from functools import reduce
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from checks.models.flat_param import FlatParamSpec
from checks.violation import Violation

PADDING_VALUE = 42.0  # `_construct_padding_tensor` fills padding with `_FLAT_PARAM_PADDING_VALUE`


def tensor_at(module: nn.Module, fqn: str) -> torch.Tensor:
    return reduce(getattr, fqn.split("."), module)


def fqns_with_ties(spec: FlatParamSpec) -> list[str]:
    return [*spec.fqns, *(t.fqn for t in spec.shared)]


def expected_flat(spec: FlatParamSpec, replica: nn.Module) -> torch.Tensor:
    """The padded unsharded flat parameter the spec lays out, filled from the replica's parameters: each parameter
    flattened at its offset, alignment and world-size padding 42 (inside the flat parameter), and the padding
    sharding adds beyond it (``use_orig_params=False``) 0, as `_get_shard`'s ``F.pad`` leaves it."""
    return laid_out(spec, {fqn: tensor_at(replica, fqn) for fqn in spec.fqns}, PADDING_VALUE)


def laid_out(spec: FlatParamSpec, values: dict[str, torch.Tensor], padding: float) -> torch.Tensor:
    """Per-parameter ``values`` (by fqn) in the spec's padded unsharded layout: ``padding`` in every padding segment
    of the flat parameter, zeros past it."""
    pieces, index = [], 0
    for numel, pad in zip(spec.numels_with_padding, spec.is_padding_mask, strict=True):
        if pad:
            pieces.append(torch.full((numel,), padding))
        else:
            pieces.append(values[spec.fqns[index]].detach().float().cpu().reshape(-1))
            index += 1
    flat = torch.cat(pieces) if pieces else torch.zeros(0)
    whole = spec.padded_unsharded_numel if spec.padded_unsharded_numel is not None else spec.flat_numel
    return F.pad(flat, [0, whole - flat.numel()])


def _first_difference(observed: torch.Tensor, expected: torch.Tensor) -> dict[str, Any]:
    """Where two tensors first differ, as plain data (shapes, index, the two values)."""
    info: dict[str, Any] = {"observed_shape": list(observed.shape), "expected_shape": list(expected.shape)}
    if observed.shape == expected.shape:
        differ = (observed.float() != expected.float()).reshape(-1).nonzero()
        if len(differ):
            i = int(differ[0])
            info.update(
                index=i, observed_value=float(observed.reshape(-1)[i]), expected_value=float(expected.reshape(-1)[i])
            )
    return info


def require_same_tensor(
    observed: torch.Tensor, expected: torch.Tensor, *, reason: str, what: str, **details: Any
) -> None:
    """``torch.equal`` or a `Violation` naming the first element that differs."""
    observed = observed.detach().cpu()
    if observed.shape == expected.shape and torch.equal(observed.float(), expected.float()):
        return
    info = _first_difference(observed, expected)
    where = (
        f" at element {info['index']}: {info['observed_value']} vs {info['expected_value']}" if "index" in info else ""
    )
    raise Violation(
        reason, f"{what} differs{where} (shape {info['observed_shape']} vs {info['expected_shape']})", **info, **details
    )


def check_slice(model: FSDP, spec: FlatParamSpec, replica: nn.Module, rank: int, when: str) -> torch.Tensor:
    """This rank's shard is its slice ``[r*c, (r+1)*c)`` of the replica laid out, and with ``use_orig_params=True``
    each original's sharded view holds the values of its piece. Returns the expected slice."""
    lo, hi = spec.shard_range(rank)
    want = expected_flat(spec, replica)[lo:hi]
    shard = model._handle.flat_param.detach()
    require_same_tensor(shard, want, reason="local-shard-differs", what=f"rank {rank} {when}: local shard [{lo}, {hi})")
    if spec.use_orig_params:
        for fqn, info in zip(spec.fqns, spec.shard_param_infos(rank), strict=True):
            start = info.intra_param_start_idx or 0
            piece = (
                tensor_at(replica, fqn).detach().float().cpu().reshape(-1)[start : start + (info.numel_in_shard or 0)]
            )
            require_same_tensor(
                tensor_at(model.module, fqn),
                piece,
                reason="view-values-differs",
                what=f"rank {rank} {when}: sharded view of {fqn}",
                fqn=fqn,
            )
    return want
