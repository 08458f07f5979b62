"""Independent expectations for the probes' tests, worked out from the toy model's layer shapes and the rules
FSDP / DDP / ZeRO document: never read from a recording.

The toy is ``Sequential(Linear(3, 7), Linear(7, 5), Linear(5, 5))`` with children ``0`` and ``1`` wrapped as their
own units and child ``2`` left in the root (``checks.toy``). Units are named by FQN; the root is ``""``.
"""

from __future__ import annotations

from math import ceil, prod

LAYERS: dict[str, tuple[int, int]] = {"0": (3, 7), "1": (7, 5), "2": (5, 5)}  # child: (in, out)
UNITS: tuple[str, ...] = ("0", "1")
ROOT = ""
UNIT_CHILDREN: dict[str, tuple[str, ...]] = {"": ("2",), "0": ("0",), "1": ("1",)}
FP32 = 4
ALIGN = 16 // FP32  # use_orig_params aligns every parameter's start to 16 bytes


def shapes(child: str) -> list[tuple[int, ...]]:
    """weight (out, in), bias (out,), in registration order."""
    i, o = LAYERS[child]
    return [(o, i), (o,)]


def unit_shapes(unit: str) -> list[tuple[int, ...]]:
    return [s for child in UNIT_CHILDREN[unit] for s in shapes(child)]


def theta() -> int:
    """|θ|."""
    return sum(prod(s) for child in LAYERS for s in shapes(child))


def show(fqn: str) -> str:
    return "(root)" if fqn == ROOT else fqn


# -- FSDP1 flat parameters ------------------------------------------------------------------------------------------
def flat_layout(unit: str, *, use_orig_params: bool = False) -> tuple[list[tuple[int, int]], int]:
    """(start, numel) of each parameter in the unit's flat parameter, and its length before world-size padding:
    parameters concatenated in registration order, each aligned to 16 bytes with use_orig_params."""
    total, layout = 0, []
    for shape in unit_shapes(unit):
        if use_orig_params and total % ALIGN:
            total += ALIGN - total % ALIGN
        layout.append((total, prod(shape)))
        total += prod(shape)
    return layout, total


def flat_numel(unit: str, n: int, *, use_orig_params: bool = False, sharded: bool = True) -> int:
    """Elements of the unit's padded unsharded flat parameter: padded to a multiple of N so every rank holds an
    equal shard (sharded strategies)."""
    _, total = flat_layout(unit, use_orig_params=use_orig_params)
    return ceil(total / n) * n if sharded else total


def fsdp1_local_originals(unit: str, n: int, rank: int) -> list[int]:
    """use_orig_params: elements of each original parameter inside this rank's shard, for those with any (a
    parameter with none gets no gradient, hence no optimizer state, on this rank)."""
    layout, _ = flat_layout(unit, use_orig_params=True)
    size = flat_numel(unit, n, use_orig_params=True) // n
    lo, hi = rank * size, (rank + 1) * size
    overlaps = [max(0, min(hi, start + numel) - max(lo, start)) for start, numel in layout]
    return [k for k in overlaps if k]


def fsdp1_shard(unit: str, n: int, **kw: bool) -> int:
    return flat_numel(unit, n, **kw) // n


# -- FSDP2 per-parameter sharding ----------------------------------------------------------------------------------
def fsdp2_padded_shard(shape: tuple[int, ...], n: int) -> int:
    """FSDP2 shards every parameter on dim 0 into N chunks of ceil(d0/N) rows, padding the last ones."""
    return ceil(shape[0] / n) * prod(shape[1:])


def fsdp2_local(shape: tuple[int, ...], n: int, rank: int) -> int:
    """Elements of the rank's own (unpadded) rows."""
    rows = ceil(shape[0] / n)
    return max(0, min(rows, shape[0] - rank * rows)) * prod(shape[1:])


def fsdp2_unit_shard(unit: str, n: int) -> int:
    return sum(fsdp2_padded_shard(s, n) for s in unit_shapes(unit))


# -- ZeRO-1 (ZeroRedundancyOptimizer) greedy partition -------------------------------------------------------------
def zero_partition(n: int) -> list[list[tuple[str, int]]]:
    """Parameters sorted by size (largest first, stable), each given to the rank with the fewest elements so far
    (the lowest rank on ties)."""
    params = [
        (f"{child}.{kind}", prod(s))
        for child in LAYERS
        for kind, s in zip(("weight", "bias"), shapes(child), strict=True)
    ]
    ranks: list[list[tuple[str, int]]] = [[] for _ in range(n)]
    sizes = [0] * n
    for name, numel in sorted(params, key=lambda p: p[1], reverse=True):
        r = sizes.index(min(sizes))
        ranks[r].append((name, numel))
        sizes[r] += numel
    return ranks


# -- communication ---------------------------------------------------------------------------------------------------
def ring_bytes(op: str, nbytes: int, n: int) -> float:
    """Bytes sent per rank: all-reduce 2(N−1)/N·S; all-gather, reduce-scatter, broadcast (N−1)/N·S."""
    factor = {"all_reduce": 2 * (n - 1), "all_gather": n - 1, "reduce_scatter": n - 1, "broadcast": n - 1}[op]
    return factor * nbytes / n


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
        return [("all_reduce", theta())] + [("broadcast", numel) for owned in zero_partition(n) for _, numel in owned]
    raise ValueError(kind)


# -- FSDP events -----------------------------------------------------------------------------------------------------
def fsdp1_backward(policy: str | None) -> list[str]:
    """FSDP1's backward hooks and prefetches for the toy, from the wrap structure.

    Pre-backward hooks fire in reverse post-forward order (the root computes the output, so it is first). A unit's
    post-backward follows its own layer's backward; the root's comes last, because autograd reaches the root's
    parameter views (created first, in the root's pre-forward) last. A prefetch targets the unit before the issuer
    in post-forward order, if that unit has not been unsharded for backward yet; BACKWARD_PRE issues it from the
    pre-backward hook, BACKWARD_POST from the post-backward hook, None never.
    """
    done: set[str] = set()
    seq: list[str] = []

    def prefetch(issuer: str) -> None:
        i = POST_FORWARD.index(issuer)
        if i > 0 and POST_FORWARD[i - 1] not in done:
            done.add(POST_FORWARD[i - 1])
            seq.append(f"prefetch {show(issuer)}→{show(POST_FORWARD[i - 1])}")

    for unit in (ROOT, *reversed(UNITS)):
        seq.append(f"pre_backward {show(unit)}")
        done.add(unit)
        if policy == "BACKWARD_PRE":
            prefetch(unit)
        if unit != ROOT:
            seq.append(f"post_backward {show(unit)}")
            if policy == "BACKWARD_POST":
                prefetch(unit)
    seq.append(f"post_backward {show(ROOT)}")
    if policy == "BACKWARD_POST":
        prefetch(ROOT)
    return seq


def fsdp1_forward(strategy: str) -> list[str]:
    """Root pre-forward unshards the root; each unit is unsharded before and resharded after its forward; FULL_SHARD
    frees the units but keeps the root (it is needed first in backward); SHARD_GRAD_OP frees nothing."""
    keep_units = strategy != "FULL_SHARD"
    seq = ["root_pre_forward (root)", "unshard (root)"]
    for unit in UNITS:
        seq += [f"unshard {unit}", f"{'reshard' if keep_units else 'free'} {unit}"]
    return [*seq, "reshard (root)"]
