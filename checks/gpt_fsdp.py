"""mini_gpt wrapped the way the guides read it: each block its own FSDP1 unit, the whole model the root.

With the `tiny` preset that is four units: ``root`` (token and position embeddings, the final LayerNorm and the
tied head) and ``blocks.0``, ``blocks.1``, ``blocks.2``. Unit names are the module paths of the original model,
with the outermost unit called ``root``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from checks.context import RankContext
from mini_gpt import GPT, BatchSampler, corpus_tokens, preset

ROOT = "root"
_WRAPPED = "_fsdp_wrapped_module."


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


def unit_name(fqn: str) -> str:
    """``_fsdp_wrapped_module.blocks.0`` → ``blocks.0``; the outermost unit is ``root``."""
    return fqn.replace(_WRAPPED, "") or ROOT


def units(model: torch.nn.Module) -> dict[str, FSDP]:
    """Every FSDP unit of ``model`` by name, outermost first (module order)."""
    return {unit_name(fqn): m for fqn, m in model.named_modules() if isinstance(m, FSDP)}


def batch(ctx: RankContext, step: int = 0, global_batch_size: int = 8, preset_name: str = "tiny") -> tuple:
    """This rank's rows of the deterministic global batch ``step``."""
    sampler = BatchSampler(corpus_tokens(), preset(preset_name).block_size, global_batch_size)
    x, y = sampler.shard(step, ctx.rank, ctx.world_size)
    return x.to(ctx.device), y.to(ctx.device)
