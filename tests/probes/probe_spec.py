"""Independent expectations for the probes' tests, composed from the toy model's layer shapes and the torch-free
rules of `checks.models`: never read from a recording.

The toy is ``Sequential(Linear(3, 7), Linear(7, 5), Linear(5, 5))`` with children ``0`` and ``1`` wrapped as their
own units and child ``2`` left in the root (`checks.workloads.toy`). Units are named as everywhere
(`checks.naming`): ``root``, ``0``, ``1``.
"""

from __future__ import annotations

from math import prod

from checks.models import flat_param, fsdp2_shards, prefetch, zero_partition
from checks.models.ring import ring_bytes
from checks.naming import ROOT
from checks.workloads.toy import DEFAULT_UNITS, TOY_LAYERS

LAYERS: dict[str, tuple[int, int]] = {str(k): layer for k, layer in enumerate(TOY_LAYERS)}  # child: (in, out)
UNITS: tuple[str, ...] = DEFAULT_UNITS
UNIT_CHILDREN: dict[str, tuple[str, ...]] = {
    ROOT: tuple(c for c in LAYERS if c not in UNITS),
    **{u: (u,) for u in UNITS},
}
FP32 = 4
ALIGN = flat_param.ALIGNMENT_BYTES // FP32  # use_orig_params aligns every parameter's start to 16 bytes

__all__ = ["ring_bytes"]


def shapes(child: str) -> list[tuple[int, ...]]:
    """weight (out, in), bias (out,), in registration order."""
    i, o = LAYERS[child]
    return [(o, i), (o,)]


def unit_shapes(unit: str) -> list[tuple[int, ...]]:
    return [s for child in UNIT_CHILDREN[unit] for s in shapes(child)]


def theta() -> int:
    """|θ|."""
    return sum(prod(s) for child in LAYERS for s in shapes(child))


# -- FSDP1 flat parameters ------------------------------------------------------------------------------------------
def _layout(unit: str, n: int = 1, *, use_orig_params: bool = False, sharded: bool = True) -> flat_param.FlatLayout:
    numels = [prod(shape) for shape in unit_shapes(unit)]
    return flat_param.layout(numels, FP32, n, align=use_orig_params, sharded=sharded)


def flat_numel(unit: str, n: int, *, use_orig_params: bool = False, sharded: bool = True) -> int:
    """Elements of the unit's padded unsharded flat parameter (unpadded under NO_SHARD)."""
    return _layout(unit, n, use_orig_params=use_orig_params, sharded=sharded).padded_numel


def fsdp1_local_originals(unit: str, n: int, rank: int) -> list[int]:
    """use_orig_params: elements of each original parameter inside this rank's shard, for those with any (a
    parameter with none gets no gradient, hence no optimizer state, on this rank)."""
    return [k for k in _layout(unit, n, use_orig_params=True).in_shard(rank) if k]


def fsdp1_shard(unit: str, n: int, **kw: bool) -> int:
    return flat_numel(unit, n, **kw) // n


# -- FSDP2 per-parameter sharding ----------------------------------------------------------------------------------
fsdp2_padded_shard = fsdp2_shards.padded_shard_numel
fsdp2_local = fsdp2_shards.local_numel


def fsdp2_unit_shard(unit: str, n: int) -> int:
    return sum(fsdp2_padded_shard(s, n) for s in unit_shapes(unit))


# -- ZeRO-1 (ZeroRedundancyOptimizer) greedy partition -------------------------------------------------------------
def zero_partition_of_toy(n: int) -> list[list[tuple[str, int]]]:
    params = [
        (f"{child}.{kind}", prod(s))
        for child in LAYERS
        for kind, s in zip(("weight", "bias"), shapes(child), strict=True)
    ]
    return zero_partition.greedy_partition(params, n)


POST_FORWARD = (*UNITS, ROOT)  # units finish their forward in order; the root's forward finishes last


def expected_comm(kind: str, n: int, *, strategy: str = "FULL_SHARD") -> list[tuple[str, int]]:
    """(op, full payload elements) of one training step, in issue order.

    - DDP: one bucket (the model is far below the 1 MiB first bucket): one all-reduce of |θ|.
    - FSDP1 (BACKWARD_PRE): forward all-gathers the root (root pre-forward), then each unit; FULL_SHARD frees
      the units after forward but not the root, so backward all-gathers unit 1 (prefetched by the root's
      pre-backward) and unit 0 (prefetched by unit 1's); reduce-scatters follow the post-backward order: units in
      reverse, the root last. SHARD_GRAD_OP keeps everything unsharded: no all-gather in backward. NO_SHARD
      all-reduces each unit's unpadded flat gradient.
    - FSDP2 (reshard after forward, the root too): forward all-gathers root, 0, 1; backward the root (its
      pre-backward), then 1 and 0 (prefetched); unit 1 reduce-scatters from autograd; the root and unit 0 take
      no gradient input (x does not require grad), so their post-backward runs in the final callback, root first.
    - ZeRO-1: DDP's all-reduce, then each rank broadcasts the parameters it owns after its local step.
    """
    if kind == "ddp":
        return [("all_reduce", theta())]
    if kind == "fsdp1":
        if strategy == "NO_SHARD":
            return [("all_reduce", flat_numel(u, n, sharded=False)) for u in ("1", "0", ROOT)]
        forward = [("all_gather", flat_numel(u, n)) for u in (ROOT, *UNITS)]
        backward = [("all_gather", flat_numel(u, n)) for u in ("1", "0")] if strategy == "FULL_SHARD" else []
        return forward + backward + [("reduce_scatter", flat_numel(u, n)) for u in ("1", "0", ROOT)]
    if kind == "fsdp2":
        ag = [("all_gather", n * fsdp2_unit_shard(u, n)) for u in (ROOT, *UNITS, ROOT, "1", "0")]
        return ag + [("reduce_scatter", n * fsdp2_unit_shard(u, n)) for u in ("1", ROOT, "0")]
    if kind == "zero":
        return [("all_reduce", theta())] + [
            ("broadcast", numel) for owned in zero_partition_of_toy(n) for _, numel in owned
        ]
    raise ValueError(kind)


# -- FSDP events -----------------------------------------------------------------------------------------------------
def fsdp1_backward(policy: str | None) -> list[str]:
    """FSDP1's backward hooks and prefetches for the toy (`checks.models.prefetch`): the root computes the output,
    so its pre-backward comes first and, since autograd reaches the root's parameter views (created first, in the
    root's pre-forward) last, its post-backward last."""
    return prefetch.backward_sequence(POST_FORWARD, policy)


def fsdp1_forward(strategy: str) -> list[str]:
    return prefetch.forward_sequence(ROOT, UNITS, strategy)
