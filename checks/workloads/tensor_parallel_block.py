"""Guide 21's tensor-parallel workload: a pre-LN transformer block of width 16 with 4 heads and separate q, k,
v and o projections (mini_gpt's fused ``qkv`` cannot be split column-wise without mixing q, k and v on one rank),
its Megatron plan under ``parallelize_module``, the same block under FSDP2 on the ``dp`` dimension of a 2 × 2
mesh, and the inputs every rank feeds it.

A batch of 2 sequences of 8 tokens is 16 tokens, so every activation a tensor-parallel collective moves is
16 × D_MODEL = 256 elements, as many as a q/k/v/o weight: size cannot tell a payload from a parameter here
(`checks.probes.payload_witness` matches storages instead).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from checks.models import tensor_parallel as tpm
from checks.ranks.context import RankContext

D_MODEL, HEADS, HIDDEN = 16, 4, 64
# 2 sequences of 8 tokens per tensor-parallel group (2D: 2 of 4 per dp rank): 16 tokens × D_MODEL per all-reduce.
TP_BATCH, TP_SEQ = 2, 8
DP, TP = 2, 2  # the 2D mesh: FSDP2 on dp, tensor parallel on tp


class Attention(nn.Module):
    """Causal self-attention with separate q, k, v projections; heads taken from the width it is given (``-1``),
    so the same code runs on a rank's share of them."""

    def __init__(self, d_model: int = D_MODEL, heads: int = HEADS) -> None:
        super().__init__()
        self.head_dim = d_model // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, d_model: int = D_MODEL, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.fc, self.proj = nn.Linear(d_model, hidden), nn.Linear(hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """A pre-LN transformer block: the residual stream plus attention, plus an MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(D_MODEL), Attention()
        self.ln_2, self.mlp = nn.LayerNorm(D_MODEL), MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def block(seed: int = 0) -> Block:
    """The block with weights from ``seed`` alone (the same on every rank)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Block()


def block_regions(prepared: bool) -> list[tpm.Region]:
    """The block as the tensor-parallel model sees it: attention, then the MLP."""
    return [tpm.attention(D_MODEL, prepared_input=prepared), tpm.mlp(D_MODEL, HIDDEN)]


def block_linears(prepared: bool = False) -> list[tpm.Linear]:
    """Every Linear of the block, as the tensor-parallel model names them (``attn.q`` ... ``mlp.proj``)."""
    return [lin for region in block_regions(prepared) for lin in region.linears]


def _tp_plan(prepared: bool) -> dict[str, Any]:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

    plan: dict[str, Any] = {f"attn.{p}": ColwiseParallel() for p in "qkv"}
    plan |= {"attn.o": RowwiseParallel(), "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel()}
    if prepared:  # one DTensor for q, k and v: their three partial input gradients add up before one all-reduce
        plan["attn"] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),),
                                          use_local_output=False)  # fmt: skip
    return plan


def tp_block(ctx: RankContext, prepared: bool = False, seed: int = 0, mesh: Any = None) -> Block:
    """The block under ``parallelize_module`` on a 1-D mesh of every rank (or ``mesh``)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    model = block(seed).to(ctx.device)
    mesh = mesh if mesh is not None else init_device_mesh(ctx.device.type, (ctx.world_size,))
    plan = _tp_plan(prepared)
    if "attn" in plan:  # the region's input first, so q, k and v receive the DTensor it makes
        parallelize_module(model.attn, mesh, plan.pop("attn"))
    return parallelize_module(model, mesh, plan)


def tp_input(ctx: RankContext, step: int = 0, requires_grad: bool = True, batch_size: int = TP_BATCH) -> torch.Tensor:
    """The same input on every tensor-parallel rank (each sees the whole batch)."""
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(batch_size, TP_SEQ, D_MODEL, generator=generator).to(ctx.device)
    return x.requires_grad_(requires_grad)


# -- 2D: FSDP2 over tensor parallel ---------------------------------------------------------------------------------
_mesh_builds = itertools.count()


def _mesh_2d(ctx: RankContext) -> Any:
    """A fresh 2 × 2 mesh whose dimension names (``dp<k>``, ``tp<k>``) are this build's own. DTensor caches
    sharding decisions keyed by specs, and ``DeviceMesh.__eq__`` compares layouts, ranks and dimension names, not
    process groups: a spec cached by an earlier check on an equal mesh (whose groups the pool has destroyed since)
    would be handed to this one, and its collectives would name a destroyed group."""
    from torch.distributed.device_mesh import init_device_mesh

    build = next(_mesh_builds)
    return init_device_mesh(ctx.device.type, (DP, TP), mesh_dim_names=(f"dp{build}", f"tp{build}"))


def mesh_dims(mesh: Any) -> tuple[Any, Any]:
    """(dp, tp) sub-meshes of a `fsdp_over_tp` mesh."""
    dp, tp = mesh.mesh_dim_names
    return mesh[dp], mesh[tp]


def fsdp_over_tp(ctx: RankContext, prepared: bool = True) -> tuple[Block, Any]:
    """The block under tensor parallelism on the mesh's ``tp`` dimension, then ``fully_shard`` on its ``dp``."""
    from torch.distributed.fsdp import fully_shard

    mesh = _mesh_2d(ctx)
    dp_mesh, tp_mesh = mesh_dims(mesh)
    model = tp_block(ctx, prepared, mesh=tp_mesh)
    fully_shard(model, mesh=dp_mesh)
    return model, mesh


def mesh_coordinates(rank: int) -> tuple[int, int]:
    """(dp, tp) coordinates of a global rank on the row-major 2 × 2 mesh."""
    return rank // TP, rank % TP
