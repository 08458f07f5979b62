"""DDP's gradient buckets, torch-free: which parameters each bucket holds in every iteration, and what a step
all-reduces and broadcasts because of them (guide 19).

What it models, from `torch/nn/parallel/distributed.py` (2.13.0) and the reducer it drives:

- The capacities (`_BucketCapacityConfig.create`): ``bucket_cap_mb`` (default 25 MiB) becomes a byte cap; when it is
  left at its default the first bucket of a rebuild gets 1 MiB (``dist._DEFAULT_FIRST_BUCKET_BYTES``), else the same
  cap; ``bucket_cap_mb_list`` gives one cap per bucket (its last repeated) and counts as not the default.
- The limits of iteration 1 (`compute_bucket_size_limits`): the list when one was given; otherwise, with
  ``static_graph`` or without ``find_unused_parameters``, a single ``sys.maxsize``, so one bucket per dtype; with
  ``find_unused_parameters`` the caps, first bucket first.
- The assignment (`dist._compute_bucket_assignment_by_size`, C++ ``compute_bucket_assignment_by_size``): walk the
  parameters in the order given, adding each one's bytes to the open bucket of its dtype; once that bucket reaches
  its limit (``>=``) it closes, so its last parameter may take it past the cap, and the next limit of the list
  applies to that dtype's next bucket (the last limit repeats). Leftover open buckets close at the end. Without an
  explicit order (iteration 1: registration order) the buckets are sorted by their smallest index and DDP hands
  them to the reducer reversed, so the reducer's bucket 0 holds the last-registered parameters. With an order (the
  rebuild: gradient-ready order) they stay in the order they closed.
- The rebuild (`_pre_forward`'s ``self.reducer._rebuild_buckets()``): only with ``static_graph`` or without
  ``find_unused_parameters``; before iteration 2's forward, or iteration 3's with ``static_graph`` (measured: its
  first iteration records no gradient-ready order). Its limits are the list when one was given, else the first
  bucket's cap then the cap. Rank 0 broadcasts the result: P + 1 int32 (every index, then the bucket count), then
  B int32 (each bucket's length).
- ``DDP_SET_LAST_BUCKET_CAP=1`` in the ranks' environment, read by the reducer's rebuild (C++; measured on 2.13.0,
  2.14.1 and 2.15.0, not quoted): the rebuild walks the gradient-ready order backwards with the same limits, then
  reverses the list of buckets it made (each bucket keeps the backward walk's order). So the first limit, the
  small cap, goes to the bucket of the gradients ready last, which is the reducer's last bucket.
- Per backward: one all-reduce per bucket, in bucket order, of the bucket's elements; with
  ``find_unused_parameters`` one more after them, of P int32 (the used-parameter map); in ``static_graph``'s first
  iteration that map first, then every bucket, all at the end of the backward.

Not modelled: sparse gradients (a bucket of their own), several devices, and the rebuild of a model with several
dtypes (its leftover buckets close in hash-map order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

MIB = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25
DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES (tests compare the two)
MAXSIZE = 2**63 - 1  # sys.maxsize on a 64-bit build: "no limit"


@dataclass(frozen=True)
class Param:
    """What the assignment reads of a parameter: its elements, bytes per element and dtype."""

    numel: int
    element_size: int = 4
    dtype: str = "float32"

    @property
    def nbytes(self) -> int:
        return self.numel * self.element_size


@dataclass(frozen=True)
class Capacity:
    """`_BucketCapacityConfig`'s three fields, in bytes."""

    bucket_bytes: int
    per_bucket_bytes: tuple[int, ...]
    first_bucket_bytes: int


@dataclass(frozen=True)
class Options:
    """The DDP constructor arguments that decide bucketing."""

    bucket_cap_mb: float | None = None
    bucket_cap_mb_list: tuple[float, ...] | None = None
    find_unused_parameters: bool = False
    static_graph: bool = False
    last_bucket_cap: bool = False  # DDP_SET_LAST_BUCKET_CAP is "1" in the ranks' environment at the rebuild


@dataclass(frozen=True)
class Step:
    """What one iteration does because of the buckets: the buckets its backward reduces (reducer order, parameter
    indices), the rebuild's broadcasts in its forward (int32 elements each), its all-reduces (elements, dtype)."""

    buckets: list[list[int]]
    broadcasts: list[int] = field(default_factory=list)
    all_reduces: list[tuple[int, str]] = field(default_factory=list)


def capacity(bucket_cap_mb: float | None = None, bucket_cap_mb_list: Sequence[float] | None = None) -> Capacity:
    """`_BucketCapacityConfig.create`: caps in bytes (``int(mb * MiB)``, truncated); 1 MiB for the first bucket
    only when neither argument was given."""
    default = bucket_cap_mb is None
    cap_mb: float = DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
    per_bucket: tuple[int, ...] = ()
    if bucket_cap_mb_list:
        per_bucket = tuple(int(mb * MIB) for mb in bucket_cap_mb_list)
        cap_mb, default = max(bucket_cap_mb_list), False
    cap = int(cap_mb * MIB)
    return Capacity(cap, per_bucket, DEFAULT_FIRST_BUCKET_BYTES if default else cap)


def size_limits(cap: Capacity, *, static_graph: bool, find_unused_parameters: bool) -> tuple[list[int], list[int]]:
    """`compute_bucket_size_limits`: (limits of iteration 1, limits for the rebuild; [] = the reducer's own)."""
    if cap.per_bucket_bytes:
        return list(cap.per_bucket_bytes), list(cap.per_bucket_bytes)
    if static_graph or not find_unused_parameters:
        return [MAXSIZE], []
    if cap.first_bucket_bytes < cap.bucket_bytes:
        return [cap.first_bucket_bytes, cap.bucket_bytes], []
    return [cap.bucket_bytes], []


def rebuild_limits(cap: Capacity, for_rebuilding: Sequence[int]) -> list[int]:
    """The limits the reducer's rebuild uses: those DDP passed, or else the first bucket's cap, then the cap."""
    return list(for_rebuilding) if for_rebuilding else [cap.first_bucket_bytes, cap.bucket_bytes]


def assign(params: Sequence[Param], limits: Sequence[int], order: Sequence[int] | None = None) -> list[list[int]]:
    """``compute_bucket_assignment_by_size``: bucket indices, walking ``params`` in ``order`` (indices into
    ``params``; None: registration order, the result then sorted by each bucket's smallest index)."""
    if not params or not limits:
        raise ValueError("the assignment needs at least one parameter and one limit")
    walk = list(range(len(params))) if order is None else list(order)
    if sorted(walk) != list(range(len(params))):
        raise ValueError(f"order {walk} is not a permutation of the {len(params)} parameters")
    closed: list[list[int]] = []
    open_buckets: dict[str, tuple[list[int], int]] = {}  # by dtype: (indices, bytes so far)
    next_limit: dict[str, int] = {}  # by dtype: position in ``limits``
    for index in walk:
        param = params[index]
        indices, size = open_buckets.get(param.dtype, ([], 0))
        indices, size = [*indices, index], size + param.nbytes
        position = next_limit.setdefault(param.dtype, 0)
        if size >= limits[position]:
            closed.append(indices)
            open_buckets.pop(param.dtype, None)
            next_limit[param.dtype] = min(position + 1, len(limits) - 1)
        else:
            open_buckets[param.dtype] = (indices, size)
    leftovers = [indices for indices, _ in open_buckets.values()]
    if order is not None and len(leftovers) > 1:
        raise ValueError("with an order, several dtypes' leftover buckets close in an order the model cannot know")
    buckets = closed + leftovers
    return sorted(buckets, key=min) if order is None else buckets


def initial_buckets(params: Sequence[Param], options: Options = Options()) -> list[list[int]]:
    """The reducer's buckets at construction: the assignment of iteration 1's limits, reversed."""
    limits, _ = size_limits(_capacity(options), static_graph=options.static_graph,
                            find_unused_parameters=options.find_unused_parameters)  # fmt: skip
    return list(reversed(assign(params, limits)))


def rebuilt_buckets(
    params: Sequence[Param], ready_order: Sequence[int], options: Options = Options()
) -> list[list[int]]:
    """The reducer's buckets after its rebuild: the rebuild limits over the gradient-ready order, not reversed; with
    ``last_bucket_cap``, over that order backwards, and the buckets then reversed (the small cap lands last)."""
    cap = _capacity(options)
    _, for_rebuilding = size_limits(cap, static_graph=options.static_graph,
                                    find_unused_parameters=options.find_unused_parameters)  # fmt: skip
    limits = rebuild_limits(cap, for_rebuilding)
    if options.last_bucket_cap:
        return list(reversed(assign(params, limits, list(reversed(ready_order)))))
    return assign(params, limits, ready_order)


def rebuild_iteration(options: Options = Options()) -> int | None:
    """The iteration whose forward rebuilds the buckets, or None: never with ``find_unused_parameters`` (and no
    ``static_graph``); the third with ``static_graph``, whose first iteration records no gradient-ready order."""
    if options.static_graph:
        return 3
    return None if options.find_unused_parameters else 2


def plan(params: Sequence[Param], ready_order: Sequence[int], options: Options = Options(),
         iterations: int = 3) -> list[Step]:  # fmt: skip
    """Every iteration's buckets, rebuild broadcasts and all-reduces, for parameters whose gradients become ready
    in ``ready_order`` in every iteration."""
    buckets = initial_buckets(params, options)
    rebuild_at = rebuild_iteration(options)
    steps = []
    for iteration in range(1, iterations + 1):
        broadcasts: list[int] = []
        if iteration == rebuild_at:
            buckets = rebuilt_buckets(params, ready_order, options)
            broadcasts = [len(params) + 1, len(buckets)]
        reduces = [(sum(params[i].numel for i in bucket), params[bucket[0]].dtype) for bucket in buckets]
        if used_map_all_reduced(options, iteration):
            used_map = (len(params), "int32")
            # static_graph's first backward delays every reduction to its end, the map first
            reduces = [used_map, *reduces] if options.static_graph else [*reduces, used_map]
        steps.append(Step(buckets, broadcasts, reduces))
    return steps


def used_map_all_reduced(options: Options, iteration: int) -> bool:
    """Whether the backward of ``iteration`` also all-reduces the used-parameter map (P int32)."""
    if options.static_graph:
        return iteration == 1
    return options.find_unused_parameters


def bucket_numels(params: Sequence[Param], buckets: Sequence[Sequence[int]]) -> list[int]:
    return [sum(params[i].numel for i in bucket) for bucket in buckets]


def view_offsets(params: Sequence[Param], bucket: Sequence[int]) -> list[int]:
    """Where each parameter's gradient starts in its bucket's flat buffer (elements): the bucket's order, packed."""
    offsets, at = [], 0
    for index in bucket:
        offsets.append(at)
        at += params[index].numel
    return offsets


def _capacity(options: Options) -> Capacity:
    return capacity(options.bucket_cap_mb, options.bucket_cap_mb_list)
