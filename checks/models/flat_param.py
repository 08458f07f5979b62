"""FSDP1's flat parameter, as a pure function of one unit's parameters: the one spec of its layout.

Written from a reading of ``torch/distributed/fsdp/_flat_param.py`` (torch 2.13.0; line numbers below are that
file's unless another is named), never by calling it. :func:`flat_param` takes what FSDP sees when it builds one
``FlatParamHandle`` and returns what the handle's ``FlatParameter`` carries: ``_fqns``, ``_shapes``, ``_numels``,
``_numels_with_padding``, ``_is_padding_mask``, ``_shared_param_infos``, ``_unpadded_unsharded_size``,
``_padded_unsharded_size``, ``_sharded_size``, and per rank ``_shard_param_infos``, ``_shard_numel_padded`` and
the shapes the original parameters take under ``use_orig_params=True``.

The rules, with where they are read:

1. Order and sharing (688-755). The handle walks ``module.named_modules(remove_duplicate=False)`` and each
   module's own parameters with duplicates, keeping those given to the unit. The first sighting of a tensor is
   flattened; a later sighting of the same tensor (a tied parameter) is not flattened again: it becomes a
   ``SharedParamInfo`` naming its primary, and gets no entry in ``_fqns``/``_shapes``/``_numels`` (694-707).
2. Alignment, ``use_orig_params=True`` only (566, 609-613). ``aligned_numel = 16 // itemsize`` (2771-2776) of the
   dtype the unit *computes* in: ``MixedPrecision.param_dtype`` if given, else the parameters' dtype (931-934).
   The flat parameter itself keeps the parameters' dtype, so fp32 parameters with bf16 ``param_dtype`` align to
   8 fp32 elements. Before every flattened parameter, including a zero-size one, if the running total is not a
   multiple of ``aligned_numel``, padding is inserted up to the next multiple (710-720). Nothing pads after the
   last parameter on this account.
3. World-size padding. ``use_orig_params=True``: a padding segment to a multiple of the process group's size is
   appended to the flat parameter itself (759-774), for every strategy, NO_SHARD included (the group is the whole
   world there). ``use_orig_params=False``: the flat parameter is the bare concatenation, and a sharded strategy
   pads each rank's chunk when it shards (``_get_shard``/``_get_unpadded_shard``, 1088-1140): ``torch.chunk``
   into ``world_size`` pieces of ``ceil(numel / world_size)``, a rank past the last piece gets an empty one, and
   each rank's chunk is zero-padded to the first's length: that is ``_shard_numel_padded``.
4. ``_unpadded_unsharded_size`` is the size of the flat parameter as built (474), so under
   ``use_orig_params=True`` it *includes* the world-size padding of rule 3 (see ``DOC_CONTRADICTIONS``).
   ``_padded_unsharded_size`` is ``shard numel * world_size`` (1285-1291), set only for a sharded strategy and only
   at lazy initialisation (the first forward). ``_sharded_size`` is the shard, or the whole flat parameter for
   NO_SHARD. A world size of 1 is always NO_SHARD (``_init_utils.py`` 430-438).
5. Shards (945-976). Rank ``r`` of a sharded strategy owns ``[r*c, (r+1)*c)`` of the padded unsharded flat
   parameter, ``c`` its shard numel; torch passes the end as inclusive (``(r+1)*c - 1``). NO_SHARD: every rank owns
   ``[0, numel)`` (958). An empty shard range is refused (1003-1006), so a unit whose parameters are all
   zero-size cannot be built.
6. ``_ShardParamInfo`` (148-161, 1022-1086), over inclusive intervals: parameter ``[s, s+n-1]``, shard
   ``[lo, hi-1]``. In shard iff ``lo <= s+n-1 and hi-1 >= s``; then ``offset_in_shard = max(s, lo) - lo``,
   ``intra_param_start_idx = max(s, lo) - s``, ``intra_param_end_idx = min(s+n, hi) - 1 - s`` (inclusive) and
   ``numel_in_shard = end - start + 1``. Otherwise ``(False, None, None, None, None)``. For a zero-size parameter
   the test reads ``lo < s < hi``: it is "in" the shard whose interior holds its offset, with
   ``numel_in_shard == 0`` and ``intra_param_end_idx == -1``, and in no shard when its offset is a shard boundary.
7. Views, ``use_orig_params=True`` (2128-2178). Sharded strategy: a parameter in the shard is the 1-D slice
   ``flat[offset_in_shard : offset_in_shard + numel_in_shard]``; one not in it is a shared size-0 tensor, shape
   ``(0,)``; a tied parameter is its primary's tensor. NO_SHARD: every parameter is its unsharded view of
   original shape (2141-2144). These are the shapes outside forward and backward, except that SHARD_GRAD_OP and
   _HYBRID_SHARD_ZERO2 skip the sharded views after a grad-enabled forward (1826-1832): until the backward the
   originals stay the forward's unsharded views, plain tensors (not parameters) of original shape.
   ``use_orig_params=False``: the originals stay registered as plain tensors (not parameters) of their original
   shape (``_use_unsharded_views(as_params=False)``, 621, 1949-2039), their storage freed once sharded.
8. ``requires_grad``: the flat parameter's is the OR over its parameters (832); ``use_orig_params=False`` refuses
   mixed values (817-825). Padding segments never require grad (713-714).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import prod

ALIGNMENT_BYTES = 16  # `_get_aligned_numel`: "This alignment constraint comes from TorchInductor."

# Bytes per element of the floating dtypes a flat parameter may hold (`_validate_tensors_to_flatten` refuses
# non-floating ones, 810-811). Names as `str(torch.<dtype>)` without the "torch." prefix, plus common aliases.
DTYPE_BYTES: Mapping[str, int] = {
    "float64": 8,
    "double": 8,
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
}

# Places where a torch docstring or comment says something its code does not do (torch 2.13.0).
DOC_CONTRADICTIONS = (
    "_flat_param.py:236-238 says `_unpadded_unsharded_size` is the size 'without right-hand-side padding for "
    "divisibility by the world size'; 474 sets it to the built flat parameter's size, which under "
    "use_orig_params=True already holds that padding (759-774).",
    "_flat_param.py:912 gives `_init_param_reduce_dtypes` the precondition that `self.flat_param` is set; __init__ "
    "calls it at 606, before `_init_flat_param_and_metadata` (615) creates the flat parameter (604 and 851 also "
    "name methods that do not exist: `_init_flat_param()`, `_init_flat_param_metadata`).",
    "_flat_param.py:1163 says `_get_flat_param_offsets` gives offsets 'without padding'; it accumulates "
    "`_numels_with_padding` (1167), so alignment and use_orig_params=True world-size padding are counted "
    "(its NOTE at 1165 admits the alignment entries).",
)


def element_bytes_of(dtype: str | int) -> int:
    """Element size of ``dtype``: a name from :data:`DTYPE_BYTES` (``"torch."`` prefix allowed) or a byte count."""
    if isinstance(dtype, int):
        width = dtype
    else:
        name = dtype.removeprefix("torch.")
        if name not in DTYPE_BYTES:
            raise ValueError(f"{dtype!r} is not a floating dtype FSDP can flatten")
        width = DTYPE_BYTES[name]
    if width < 1 or ALIGNMENT_BYTES % width:
        raise ValueError(f"element size {width} does not divide the {ALIGNMENT_BYTES}-byte alignment")
    return width


@dataclass(frozen=True)
class Param:
    """One original parameter of the unit, in the order the handle walks them (rule 1).

    ``tied_to``: the fqn of an earlier parameter this one is the same tensor as (a shared, tied parameter)."""

    fqn: str
    shape: tuple[int, ...]
    requires_grad: bool = True
    tied_to: str | None = None

    @property
    def numel(self) -> int:
        return prod(self.shape)


@dataclass(frozen=True)
class ShardParamInfo:
    """torch's ``_ShardParamInfo`` (148-161): where one parameter sits in one rank's shard."""

    in_shard: bool
    offset_in_shard: int | None
    numel_in_shard: int | None
    intra_param_start_idx: int | None
    intra_param_end_idx: int | None  # inclusive, as torch's

    @classmethod
    def absent(cls) -> ShardParamInfo:
        return cls(False, None, None, None, None)

    def as_tuple(self) -> tuple[bool, int | None, int | None, int | None, int | None]:
        return (
            self.in_shard,
            self.offset_in_shard,
            self.numel_in_shard,
            self.intra_param_start_idx,
            self.intra_param_end_idx,
        )


def _split_fqn(fqn: str) -> tuple[str, str]:
    module, _, name = fqn.rpartition(".")
    return module, name


@dataclass(frozen=True)
class SharedParam:
    """torch's ``SharedParamInfo`` without the module objects: a tied parameter and its primary."""

    fqn: str
    prim_fqn: str

    @property
    def module_name(self) -> str:
        return _split_fqn(self.fqn)[0]

    @property
    def param_name(self) -> str:
        return _split_fqn(self.fqn)[1]

    @property
    def prim_module_name(self) -> str:
        return _split_fqn(self.prim_fqn)[0]

    @property
    def prim_param_name(self) -> str:
        return _split_fqn(self.prim_fqn)[1]


@dataclass(frozen=True)
class FlatParamSpec:
    """One unit's flat parameter: what the ``FlatParameter`` carries, and each rank's share of it."""

    # Per flattened (primary) parameter, as `_fqns`, `_shapes`, `_numels`.
    fqns: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    numels: tuple[int, ...]
    offsets: tuple[int, ...]  # start in the unsharded flat parameter, alignment padding before it included
    padding_before: tuple[int, ...]  # alignment padding elements inserted just before each parameter
    # Per segment of the built flat parameter (parameters and padding), as `_numels_with_padding`.
    numels_with_padding: tuple[int, ...]
    is_padding_mask: tuple[bool, ...]
    shared: tuple[SharedParam, ...]  # `_shared_param_infos`
    params_end: int  # end of the last parameter, before any world-size padding
    tail_padding: int  # world-size padding (in the flat parameter, or added by sharding: rule 3)
    flat_numel: int  # the flat parameter as built: `_unpadded_unsharded_size`
    padded_unsharded_numel: int | None  # `_padded_unsharded_size`; None under NO_SHARD (never set there)
    shard_numel: int  # `_sharded_size`
    world_size: int
    sharded: bool  # False for NO_SHARD, which world size 1 always is
    use_orig_params: bool
    aligned_numel: int  # the handle's `_aligned_numel`: 0 without alignment
    requires_grad: bool

    def shard_range(self, rank: int) -> tuple[int, int]:
        """[start, end) of ``rank``'s shard in the padded unsharded flat parameter (NO_SHARD: the whole)."""
        self._check_rank(rank)
        if not self.sharded:
            return 0, self.flat_numel
        return rank * self.shard_numel, (rank + 1) * self.shard_numel

    def shard_numel_padded(self, rank: int) -> int:
        """``_shard_numel_padded``: elements of ``rank``'s shard past the end of the built flat parameter."""
        lo, hi = self.shard_range(rank)
        return hi - max(lo, min(hi, self.flat_numel))

    def shard_param_infos(self, rank: int) -> tuple[ShardParamInfo, ...]:
        """``_shard_param_infos`` on ``rank`` (rule 6)."""
        lo, hi = self.shard_range(rank)
        infos = []
        for s, n in zip(self.offsets, self.numels, strict=True):
            # torch's test over inclusive ends: lo <= s + n - 1 and hi - 1 >= s.
            if not (lo < s + n and s < hi):
                infos.append(ShardParamInfo.absent())
                continue
            first, stop = max(s, lo), min(s + n, hi)
            infos.append(ShardParamInfo(True, first - lo, stop - first, first - s, stop - 1 - s))
        return tuple(infos)

    def in_shard(self, rank: int) -> tuple[int, ...]:
        """Elements of each parameter inside ``rank``'s shard (0 where it has none)."""
        return tuple(info.numel_in_shard or 0 for info in self.shard_param_infos(rank))

    def view_shapes(self, rank: int) -> dict[str, tuple[int, ...]]:
        """Shape of every original parameter (tied ones included) on ``rank`` outside forward/backward (rule 7)."""
        if not self.use_orig_params or not self.sharded:
            shapes = dict(zip(self.fqns, self.shapes, strict=True))
        else:
            infos = self.shard_param_infos(rank)
            shapes = {fqn: (info.numel_in_shard or 0,) for fqn, info in zip(self.fqns, infos, strict=True)}
        for tie in self.shared:
            shapes[tie.fqn] = shapes[tie.prim_fqn]
        return shapes

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a world of {self.world_size}")


def flat_param(
    params: Sequence[Param],
    world_size: int,
    *,
    use_orig_params: bool,
    dtype: str | int = "float32",
    compute_dtype: str | int | None = None,
    sharded: bool = True,
) -> FlatParamSpec:
    """The flat parameter FSDP1 builds for one unit.

    ``params``: the unit's parameters in walk order (rule 1). ``world_size``: the size of the group the unit shards
    over (HYBRID_SHARD: the shard group). ``dtype``: the parameters' dtype (one for the unit; FSDP refuses mixed
    dtypes). ``compute_dtype``: ``MixedPrecision.param_dtype``, or None when there is none. ``sharded``: False for
    NO_SHARD."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    element_bytes_of(dtype)  # refuse what FSDP cannot flatten
    width = element_bytes_of(dtype if compute_dtype is None else compute_dtype)
    sharded = sharded and world_size > 1
    aligned_numel = ALIGNMENT_BYTES // width if use_orig_params else 0

    primaries: dict[str, Param] = {}
    shared: list[SharedParam] = []
    for param in params:
        if any(d < 0 for d in param.shape):
            raise ValueError(f"{param.fqn} cannot have shape {param.shape}")
        if param.fqn in primaries or any(t.fqn == param.fqn for t in shared):
            raise ValueError(f"{param.fqn} appears twice")
        if param.tied_to is None:
            primaries[param.fqn] = param
        elif param.tied_to in primaries:
            shared.append(SharedParam(param.fqn, param.tied_to))
        else:
            raise ValueError(f"{param.fqn} is tied to {param.tied_to}, which is not an earlier flattened parameter")
    if not primaries:
        raise ValueError("a flat parameter needs at least one parameter")
    grads = {p.requires_grad for p in primaries.values()}
    if not use_orig_params and len(grads) > 1:
        raise ValueError("use_orig_params=False needs uniform requires_grad within a flat parameter")

    offsets, before, segments, mask = [], [], [], []
    total = 0
    for param in primaries.values():
        pad = -total % aligned_numel if aligned_numel else 0
        if pad:
            segments.append(pad)
            mask.append(True)
        total += pad
        before.append(pad)
        offsets.append(total)
        segments.append(param.numel)
        mask.append(False)
        total += param.numel
    params_end = total
    tail = -total % world_size  # torch: pads iff 0 < world_size - total % world_size < world_size
    if use_orig_params and tail:  # in the flat parameter itself, whatever the strategy
        segments.append(tail)
        mask.append(True)
        total += tail
    flat_numel = total
    if sharded:
        shard_numel = -(-flat_numel // world_size)  # torch.chunk's piece: ceil(numel / world_size)
        padded: int | None = shard_numel * world_size
    else:
        shard_numel, padded = flat_numel, None
    if shard_numel == 0:
        raise ValueError("every parameter is zero-size: FSDP asserts on the empty shard range")
    return FlatParamSpec(
        fqns=tuple(primaries),
        shapes=tuple(tuple(p.shape) for p in primaries.values()),
        numels=tuple(p.numel for p in primaries.values()),
        offsets=tuple(offsets),
        padding_before=tuple(before),
        numels_with_padding=tuple(segments),
        is_padding_mask=tuple(mask),
        shared=tuple(shared),
        params_end=params_end,
        tail_padding=(padded if padded is not None else flat_numel) - params_end,
        flat_numel=flat_numel,
        padded_unsharded_numel=padded,
        shard_numel=shard_numel,
        world_size=world_size,
        sharded=sharded,
        use_orig_params=use_orig_params,
        aligned_numel=aligned_numel,
        requires_grad=True in grads,
    )


# -- the numel-only view the guides use ------------------------------------------------------------------------------
@dataclass(frozen=True)
class FlatLayout:
    """Where each parameter sits in the unsharded flat parameter, and how it splits across ranks: a view of a
    :class:`FlatParamSpec` over anonymous 1-D parameters."""

    starts: tuple[int, ...]  # offset of each parameter, alignment padding before it included
    numels: tuple[int, ...]
    unpadded_numel: int  # end of the last parameter: the length before world-size padding
    padded_numel: int  # what one all-gather produces (NO_SHARD: the flat parameter each rank holds)
    world_size: int  # 1 under NO_SHARD: one shard, the whole
    spec: FlatParamSpec = field(repr=False, compare=False)

    @property
    def shard_numel(self) -> int:
        return self.padded_numel // self.world_size

    def shard_range(self, rank: int) -> tuple[int, int]:
        """[start, end) of ``rank``'s shard in the padded unsharded flat parameter."""
        return self.spec.shard_range(rank)

    def in_shard(self, rank: int) -> tuple[int, ...]:
        """Elements of each parameter inside ``rank``'s shard (0 for a parameter the shard does not touch)."""
        return self.spec.in_shard(rank)


def layout(
    numels: Sequence[int], element_bytes: int, world_size: int, *, align: bool = True, sharded: bool = True
) -> FlatLayout:
    """The layout of a flat parameter over parameters of ``numels`` elements, computing in ``element_bytes``.

    ``align``: ``use_orig_params=True`` (16-byte alignment between parameters, world-size padding inside the flat
    parameter). ``sharded``: a strategy that shards; NO_SHARD keeps the whole flat parameter on each rank and
    ``shard_numel`` is then its whole length. Like FSDP, it refuses a unit whose parameters are all zero-size."""
    element_bytes_of(element_bytes)
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if any(n < 0 for n in numels):
        raise ValueError(f"a parameter cannot have a negative number of elements: {list(numels)}")
    spec = flat_param(
        [Param(f"p{i}", (n,)) for i, n in enumerate(numels)],
        world_size,
        use_orig_params=align,
        dtype=element_bytes,
        sharded=sharded,
    )
    padded = spec.padded_unsharded_numel if spec.padded_unsharded_numel is not None else spec.flat_numel
    return FlatLayout(spec.offsets, spec.numels, spec.params_end, padded, spec.world_size if spec.sharded else 1, spec)


def aligned_numel(numels: Sequence[int], element_bytes: int, align: bool = True) -> int:
    """Elements of the unsharded flat parameter before world-size padding."""
    return layout(numels, element_bytes, 1, align=align).unpadded_numel


def padded_numel(numels: Sequence[int], element_bytes: int, world_size: int, align: bool = True) -> int:
    """Elements of the padded unsharded flat parameter: what one all-gather produces."""
    return layout(numels, element_bytes, world_size, align=align).padded_numel
