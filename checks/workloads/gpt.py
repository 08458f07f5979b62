"""mini_gpt wrapped the way the guides read it: each block its own FSDP1 unit, the whole model the root.

`fsdp2_gpt` is the same split under FSDP2's ``fully_shard`` (guides 17 and 18).

With the `tiny` preset that is four units: ``root`` (token and position embeddings, the final LayerNorm and the
tied head) and ``blocks.0``, ``blocks.1``, ``blocks.2``, named as everywhere (`checks.naming`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from checks.models.zero_memory import Param
from checks.naming import ROOT, unit_name
from checks.ranks.context import RankContext
from checks.workloads.toy import wrap_ddp
from mini_gpt import GPT, BatchSampler, corpus_tokens, preset


def fsdp1_gpt(
    ctx: RankContext,
    *,
    preset_name: str = "tiny",
    seed: int = 0,
    block_kwargs: list[dict[str, Any]] | None = None,
    model_class: type[GPT] = GPT,
    **fsdp_kwargs: Any,
) -> FSDP:
    """Wrap each block, then the model. ``fsdp_kwargs`` go to every unit (``use_orig_params=True`` unless given);
    ``block_kwargs[i]`` overrides them for block i (to build deliberately inconsistent units)."""
    fsdp_kwargs.setdefault("use_orig_params", True)
    model = model_class(preset(preset_name), seed=seed).to(ctx.device)
    for i, block in enumerate(model.blocks):
        overrides = block_kwargs[i] if block_kwargs else {}
        model.blocks[i] = FSDP(block, device_id=ctx.device, **{**fsdp_kwargs, **overrides})
    return FSDP(model, device_id=ctx.device, **fsdp_kwargs)


def fsdp2_gpt(
    ctx: RankContext, reshard_after_forward: bool | int | None = True, *, seed: int = 0, **fully_shard_kwargs: Any
) -> torch.nn.Module:
    """mini_gpt tiny with ``fully_shard`` on each block, then on the model (the root), on a 1-D mesh of all ranks.
    ``None`` leaves ``reshard_after_forward`` at its default; ``fully_shard_kwargs`` (``mp_policy``, ...) go to
    every call."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = GPT(preset("tiny"), seed=seed).to(ctx.device)
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    kwargs = dict(fully_shard_kwargs)
    if reshard_after_forward is not None:
        kwargs["reshard_after_forward"] = reshard_after_forward
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **kwargs)
    return fully_shard(model, mesh=mesh, **kwargs)


def units(model: torch.nn.Module) -> dict[str, FSDP]:
    """Every FSDP unit of ``model`` by name, outermost first (module order)."""
    return {unit_name(path): m for path, m in model.named_modules() if isinstance(m, FSDP)}


def batch(ctx: RankContext, step: int = 0, global_batch_size: int = 8, preset_name: str = "tiny") -> tuple:
    """This rank's rows of the deterministic global batch ``step``."""
    sampler = BatchSampler(corpus_tokens(), preset(preset_name).block_size, global_batch_size)
    x, y = sampler.shard(step, ctx.rank, ctx.world_size)
    return x.to(ctx.device), y.to(ctx.device)


def unit_of_parameter(name: str, unit_names: Any) -> str:
    """The unit a parameter of mini_gpt belongs to: its ``blocks.i`` prefix when that is a unit, else the root."""
    prefix = ".".join(name.split(".")[:2])
    return prefix if prefix in unit_names else ROOT


def unit_parameters(preset_name: str = "tiny") -> dict[str, list[tuple[str, int]]]:
    """(name, numel) of each parameter per unit of mini_gpt wrapped as root + one unit per block, in
    registration order (the order FSDP flattens them), root first; a tied weight counts once, in its first owner.
    Names are the unwrapped model's (``blocks.0.attn.qkv.weight``). Built on the meta device: no memory, no RNG."""
    config = preset(preset_name)
    blocks = [f"blocks.{i}" for i in range(config.n_layer)]
    found: dict[str, list[tuple[str, int]]] = {ROOT: [], **{name: [] for name in blocks}}
    with torch.device("meta"):
        model = GPT(config)
    for name, param in model.named_parameters():  # named_parameters() skips the tied duplicate
        found[unit_of_parameter(name, found)].append((name, param.numel()))
    return found


def unit_numels(preset_name: str = "tiny") -> dict[str, list[int]]:
    """Parameter sizes per unit (see `unit_parameters`): the input the flat-parameter model
    (`checks.models.flat_param`) turns into sizes."""
    return {unit: [numel for _, numel in params] for unit, params in unit_parameters(preset_name).items()}


def padded_sizes(world_size: int, element_bytes: int, preset_name: str = "tiny") -> dict[str, int]:
    """Padded unsharded flat-parameter sizes per unit, in unit order (root, blocks.0, ...), by the flat-parameter
    model: the all-gather sizes of one forward."""
    from checks.models.flat_param import padded_numel

    return {name: padded_numel(numels, element_bytes, world_size) for name, numels in unit_numels(preset_name).items()}


# Post-forward order of the tiny wrap: the blocks in forward order, the root (whose forward ends last) last.
BLOCKS = ("blocks.0", "blocks.1", "blocks.2")  # the tiny preset's units besides the root
POST_FORWARD = (*BLOCKS, ROOT)


def post_backward_order(post_forward: tuple[str, ...] = POST_FORWARD) -> list[str]:
    """Units in the order their post-backward hooks run, by the prefetch model's backward sequence."""
    from checks.models.prefetch import backward_sequence

    return [line.split()[1] for line in backward_sequence(post_forward, None) if line.startswith("post_backward")]


def grad_shards(grads: dict[str, torch.Tensor], world_size: int, rank: int) -> dict[str, torch.Tensor]:
    """Each unit's sharded gradient on ``rank`` as the layout model places the given per-parameter gradients
    (by the unwrapped model's names): parameters in flattening order, zeros in the alignment and world-size
    padding, then this rank's equal slice."""
    from checks.models.flat_param import layout

    shards = {}
    for unit, params in unit_parameters().items():
        flat = layout([numel for _, numel in params], element_bytes=4, world_size=world_size)
        full = torch.zeros(flat.padded_numel, dtype=torch.float32)
        for (name, numel), start in zip(params, flat.starts, strict=True):
            full[start : start + numel] = grads[name].detach().flatten().cpu()
        lo, hi = flat.shard_range(rank)
        shards[unit] = full[lo:hi]
    return shards


def ddp_gpt(ctx: RankContext, seed: int = 0) -> torch.nn.Module:
    """mini_gpt tiny from ``seed`` under DDP: the replica whose averaged gradients FSDP's are compared against."""
    return wrap_ddp(GPT(preset("tiny"), seed=seed).to(ctx.device), ctx)


def ddp_grads(ddp: torch.nn.Module) -> dict[str, torch.Tensor]:
    """DDP's averaged gradients by the unwrapped model's parameter names."""
    return {name.removeprefix("module."): p.grad for name, p in ddp.named_parameters() if p.grad is not None}


def flat_grad_shards(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each FSDP1 unit's sharded flat gradient on this rank, on the CPU."""
    return {name: unit._handle.flat_param.grad.detach().cpu() for name, unit in units(model).items()}


def parameters_of_tiny() -> list[Param]:
    """mini_gpt tiny's parameters in registration order (a tied weight once), with their unit and shape: the input
    of the memory model. Built on the meta device."""
    with torch.device("meta"):
        model = GPT(preset("tiny"))
    return [Param(unit_of_parameter(n, BLOCKS), n, tuple(p.shape)) for n, p in model.named_parameters()]


def tiny_shapes() -> dict[str, list[tuple[int, ...]]]:
    """mini_gpt tiny's parameter shapes per unit (root first, registration order, a tied weight once); meta device."""
    with torch.device("meta"):
        model = GPT(preset("tiny"))
    shapes: dict[str, list[tuple[int, ...]]] = {ROOT: [], **{b: [] for b in BLOCKS}}
    for name, param in model.named_parameters():
        shapes[unit_of_parameter(name, shapes)].append(tuple(param.shape))
    return shapes
