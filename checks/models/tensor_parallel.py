"""Tensor parallelism as Megatron splits a transformer block (torch-free; guide 21): which parameters each of N
ranks holds, and which collectives one forward and one backward issue, of what size.

A block is regions (the MLP, the attention), each a few ``nn.Linear`` layers: column-wise ones that read the
region's input, then one row-wise layer that writes its output. With ``ColwiseParallel`` /
``RowwiseParallel`` on N ranks (`torch.distributed.tensor.parallel.style`):

- a column-wise Linear(in, out) keeps rows of its weight: ``Shard(0)``, local (out/N, in), and its bias
  ``Shard(0)``, out/N; its output is sharded on the last (feature) dimension, so what follows (an activation, the
  attention's heads) runs on 1/N of the features with no communication;
- a row-wise Linear(in, out) keeps columns of its weight: ``Shard(1)``, local (out, in/N); its bias is replicated.
  Each rank's product is a partial sum over its in/N features: the output is ``Partial`` and is all-reduced
  to a replicated tensor, tokens × out elements (forward, one per region);
- in backward, the gradient of a column-wise layer's input is partial too (a sum over the out/N features each
  rank holds) and is all-reduced where that input became a DTensor: ``DTensor.from_local``'s backward. Each
  column-wise layer annotates its own input, so a region whose input feeds k column-wise layers (attention's
  q, k and v: k = 3) all-reduces k times; a ``PrepareModuleInput`` on the region makes the input one DTensor
  first, and the k partial gradients add up into one all-reduce (backward, one per region then). A region whose
  input does not require a gradient (the first layer of a model) all-reduces nothing in backward.

No parameter and no parameter gradient is communicated: each rank's gradient is already its shard's. The
all-reduced tensors are activations (forward) and activation gradients (backward), tokens × d_model elements
each (tokens: batch × sequence per rank), whatever the parameters' size.

Inputs are plain (features, token counts, degrees), so a planner can ask what tensor parallelism costs per step
before anything runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from checks.models.ring import ring_bytes

COLWISE, ROWWISE = "colwise", "rowwise"


@dataclass(frozen=True)
class Linear:
    """One ``nn.Linear(in_features, out_features)`` of a region and the style it is parallelized with."""

    name: str
    in_features: int
    out_features: int
    style: str  # "colwise" | "rowwise"
    bias: bool = True


@dataclass(frozen=True)
class Region:
    """Column-wise linears reading one input, and the row-wise linear writing the output."""

    name: str
    linears: tuple[Linear, ...]
    prepared_input: bool = False  # a PrepareModuleInput makes the input one DTensor for every column-wise layer

    @property
    def colwise(self) -> tuple[Linear, ...]:
        return tuple(lin for lin in self.linears if lin.style == COLWISE)

    @property
    def rowwise(self) -> tuple[Linear, ...]:
        return tuple(lin for lin in self.linears if lin.style == ROWWISE)


@dataclass(frozen=True)
class Shard:
    """What one rank holds of one parameter: its placement on the tensor-parallel dimension, the global and the
    local shape."""

    name: str
    placement: str  # "Shard(dim=0)" | "Shard(dim=1)" | "Replicate()", as DTensor prints them
    shape: tuple[int, ...]
    local_shape: tuple[int, ...]

    @property
    def local_numel(self) -> int:
        out = 1
        for d in self.local_shape:
            out *= d
        return out


@dataclass(frozen=True)
class Op:
    """One collective a region issues: its kind, the elements it moves, in which pass, and what they are."""

    op: str  # "all_reduce"
    numel: int
    backward: bool
    region: str
    tensor: str  # "output" (forward) | "input gradient" (backward)


def mlp(d_model: int, hidden: int, *, name: str = "mlp") -> Region:
    """fc (column-wise) then proj (row-wise): one all-reduce forward, one backward."""
    fc, proj = Linear(f"{name}.fc", d_model, hidden, COLWISE), Linear(f"{name}.proj", hidden, d_model, ROWWISE)
    return Region(name, (fc, proj))


def attention(d_model: int, *, name: str = "attn", prepared_input: bool = False) -> Region:
    """q, k, v (column-wise: whole heads per rank), then o (row-wise)."""
    qkv = tuple(Linear(f"{name}.{p}", d_model, d_model, COLWISE) for p in "qkv")
    return Region(name, (*qkv, Linear(f"{name}.o", d_model, d_model, ROWWISE)), prepared_input)


def _split(size: int, degree: int, what: str) -> int:
    if degree < 1 or size % degree:
        raise ValueError(f"{what} of {size} does not split evenly over {degree} ranks")
    return size // degree


def shards(linears: Sequence[Linear], degree: int) -> list[Shard]:
    """Every parameter of ``linears`` as one rank holds it (every rank holds the same shapes)."""
    out = []
    for lin in linears:
        weight = (lin.out_features, lin.in_features)
        if lin.style == COLWISE:
            rows = _split(lin.out_features, degree, f"{lin.name}'s out_features")
            out.append(Shard(f"{lin.name}.weight", "Shard(dim=0)", weight, (rows, lin.in_features)))
            if lin.bias:
                out.append(Shard(f"{lin.name}.bias", "Shard(dim=0)", (lin.out_features,), (rows,)))
        elif lin.style == ROWWISE:
            cols = _split(lin.in_features, degree, f"{lin.name}'s in_features")
            out.append(Shard(f"{lin.name}.weight", "Shard(dim=1)", weight, (lin.out_features, cols)))
            if lin.bias:
                out.append(Shard(f"{lin.name}.bias", "Replicate()", (lin.out_features,), (lin.out_features,)))
        else:
            raise ValueError(f"{lin.name}: style is {COLWISE!r} or {ROWWISE!r}, not {lin.style!r}")
    return out


def region_collectives(region: Region, tokens: int, degree: int, *, input_requires_grad: bool = True) -> list[Op]:
    """One forward then one backward of ``region`` on ``tokens`` tokens per rank (nothing on one rank)."""
    if degree == 1:
        return []
    if len(region.rowwise) != 1 or not region.colwise:
        raise ValueError(f"{region.name}: a region is column-wise layers and one row-wise layer")
    out_features = region.rowwise[0].out_features
    forward = [Op("all_reduce", tokens * out_features, False, region.name, "output")]
    if not input_requires_grad:
        return forward
    entries = 1 if region.prepared_input else len(region.colwise)
    in_features = region.colwise[0].in_features
    return forward + [Op("all_reduce", tokens * in_features, True, region.name, "input gradient")] * entries


def collectives(regions: Sequence[Region], tokens: int, degree: int, *,
                first_input_requires_grad: bool = True) -> list[Op]:  # fmt: skip
    """Forward through ``regions`` in order, then backward in reverse: every collective of one step. Only the
    first region's input may not require a gradient (every later one is the output of a region)."""
    forward, backward = [], []
    for k, region in enumerate(regions):
        ops = region_collectives(region, tokens, degree, input_requires_grad=k > 0 or first_input_requires_grad)
        forward += [o for o in ops if not o.backward]
        backward = [o for o in ops if o.backward] + backward
    return forward + backward


def step_ring_bytes(ops: Sequence[Op], element_bytes: int, degree: int) -> Fraction:
    """Bytes each rank sends for ``ops`` under the ring model: 2(N−1)/N · S per all-reduce."""
    return sum((ring_bytes(o.op, o.numel * element_bytes, degree) for o in ops), Fraction(0))


def transformer_step(n_layer: int, tokens: int, d_model: int, hidden: int, degree: int, *, element_bytes: int = 4,
                     prepared_attention: bool = True) -> Fraction:  # fmt: skip
    """Ring bytes per rank of one step of ``n_layer`` blocks (attention then MLP each), every region's input
    requiring a gradient: the Megatron count is four all-reduces of tokens × d_model per block."""
    block = [attention(d_model, prepared_input=prepared_attention), mlp(d_model, hidden)]
    return step_ring_bytes(collectives(block * n_layer, tokens, degree), element_bytes, degree)


# -- FSDP over tensor parallelism: a 2-D mesh (dp, tp) -------------------------------------------------------------
def fsdp_over_tp_placements(shard: Shard, tp_degree: int) -> str:
    """The placements ``fully_shard`` on the mesh's dp dimension gives a tensor-parallel parameter, as DTensor
    prints them: dp first. FSDP shards dim 0 of what each tp rank holds; when tensor parallelism already split dim
    0, the dp shard of the whole tensor is strided: rows interleave in blocks, tp-local first (``_StridedShard``
    with split factor ``tp_degree``)."""
    tp = {"Shard(dim=0)": "Shard(dim=0)", "Shard(dim=1)": "Shard(dim=1)", "Replicate()": "Replicate()"}[shard.placement]
    dp = f"_StridedShard(dim=0, sf={tp_degree})" if shard.placement == "Shard(dim=0)" else "Shard(dim=0)"
    return f"({dp}, {tp})"


def fsdp_over_tp_local(shard: Shard, dp_degree: int) -> tuple[int, ...]:
    """What one rank of the 2-D mesh holds: its tp shard's dim 0 split over the dp ranks."""
    rows = _split(shard.local_shape[0], dp_degree, f"{shard.name}'s tp-local dim 0")
    return (rows, *shard.local_shape[1:])
