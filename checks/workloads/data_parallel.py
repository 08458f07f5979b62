"""Data-parallel training on mini_gpt tiny behind one small interface (guides 13 and 21): DDP, torch's
ZeroRedundancyOptimizer, the reference ZeRO stages (`checks.zero`), FSDP1's three strategies and FSDP2, each a
`Trained` that steps, reads its whole parameters and gradients, and lists what it holds (`held_bytes`)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn

from checks.models.zero_memory import REFERENCE, optimizer
from checks.naming import clean
from checks.probes.memory import held_tensors, plain_tensors
from checks.ranks.context import RankContext
from checks.workloads.gpt import BLOCKS, fsdp1_gpt
from checks.workloads.toy import wrap_ddp
from checks.zero import STAGES
from mini_gpt import GPT, preset

LR = 1e-3
BF16 = torch.bfloat16
FSDP1_STRATEGIES = {"no-shard": "NO_SHARD", "shard-grad-op": "SHARD_GRAD_OP", "full-shard": "FULL_SHARD"}
CATEGORIES = ("params", "grads", "optim", "master")


@dataclass
class Trained:
    """One implementation of data-parallel training, ready to step: a model to call, and how to step it, read its
    whole parameters and gradients (collectives where they are sharded), and list what it holds."""

    name: str
    model: nn.Module
    optim: Any
    step_fn: Callable[[], None]
    zero_grad_fn: Callable[[], None]
    params_fn: Callable[[], dict[str, torch.Tensor]]
    grads_fn: Callable[[], dict[str, torch.Tensor]]
    extra: Callable[[], Iterator[tuple[str, str, Any]]] = field(default=lambda: iter(()))
    autocast: bool = False

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast("cpu", dtype=BF16) if self.autocast else contextlib.nullcontext():
            return self.model(x, y)


def gpt_replica(ctx: RankContext, seed: int = 0) -> GPT:
    """mini_gpt tiny from ``seed``, unwrapped, on this rank's device."""
    return GPT(preset("tiny"), seed=seed).to(ctx.device)


def _named(model: nn.Module) -> dict[str, torch.Tensor]:
    return {clean(n): p.detach().clone() for n, p in model.named_parameters()}


def _named_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {clean(n): p.grad.detach().clone() for n, p in model.named_parameters()}


def optimizer_class(name: str) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The torch.optim class and keyword arguments of `checks.models.zero_memory.OPTIMIZERS` entry ``name``;
    AdamW's are mini_gpt's (`mini_gpt.train.make_optimizer`), Adam's the same betas, no weight decay."""
    spec = optimizer(name)
    kwargs: dict[str, Any] = dict(spec.options)
    if spec.torch_class in ("Adam", "AdamW"):
        kwargs.update(betas=(0.9, 0.95), weight_decay=0.0)
    return getattr(torch.optim, spec.torch_class), kwargs


def make(name: str, params: Any, lr: float = LR) -> torch.optim.Optimizer:
    cls, kwargs = optimizer_class(name)
    return cls(params, lr=lr, **kwargs)


def build(
    impl: str,
    ctx: RankContext,
    precision: str = "fp32",
    lr: float = LR,
    *,
    optim_name: str = "adamw",
    use_orig_params: bool = True,
) -> Trained:
    """``impl`` from `checks.models.zero_memory.IMPLEMENTATIONS`, on mini_gpt tiny from seed 0, stepped by the
    optimizer ``optim_name`` (`checks.models.zero_memory.OPTIMIZERS`; AdamW is mini_gpt's own);
    ``use_orig_params`` for FSDP1's."""
    mixed = precision == "bf16"
    new_optimizer = partial(make, optim_name)
    if impl in ("ddp", "torch-zero"):
        ddp = wrap_ddp(gpt_replica(ctx), ctx)
        if impl == "ddp":
            optim = new_optimizer(ddp.parameters(), lr)
        else:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            cls, kwargs = optimizer_class(optim_name)
            optim = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=cls, lr=lr, **kwargs)
        return Trained(impl, ddp, optim, optim.step, partial(optim.zero_grad, set_to_none=True),
                       partial(_named, ddp.module), partial(_named_grads, ddp.module), autocast=mixed)  # fmt: skip
    if impl in REFERENCE:
        options = {"prefetch": True} if impl == "zero3-prefetch" else {}
        engine = STAGES[REFERENCE[impl]](gpt_replica(ctx), BLOCKS, make_optimizer=partial(make, optim_name, lr=lr),
                                         param_dtype=BF16 if mixed else None, **options)  # fmt: skip
        return Trained(impl, engine.model, engine.optim, engine.step, engine.zero_grad, engine.full_params,
                       engine.full_grads, engine.held)  # fmt: skip
    if impl in FSDP1_STRATEGIES:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import MixedPrecision, ShardingStrategy

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # NO_SHARD's deprecation (guide 09)
            model = fsdp1_gpt(ctx, sharding_strategy=ShardingStrategy[FSDP1_STRATEGIES[impl]],
                              mixed_precision=MixedPrecision(param_dtype=BF16) if mixed else None,
                              use_orig_params=use_orig_params)  # fmt: skip
        optim = new_optimizer(model.parameters(), lr)

        def full(grads: bool) -> dict[str, torch.Tensor]:
            with FSDP.summon_full_params(model, writeback=False, with_grads=grads):
                return (_named_grads if grads else _named)(model)

        return Trained(impl, model, optim, optim.step, partial(optim.zero_grad, set_to_none=True),
                       partial(full, False), partial(full, True))  # fmt: skip
    if impl == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        model = gpt_replica(ctx)
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        policy = MixedPrecisionPolicy(param_dtype=BF16) if mixed else MixedPrecisionPolicy()
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        optim = new_optimizer(model.parameters(), lr)

        def gathered(grads: bool) -> dict[str, torch.Tensor]:
            out = {}
            for name, p in model.named_parameters():
                t = p.grad if grads else p
                out[clean(name)] = t.detach().full_tensor().clone()
            return out

        return Trained(impl, model, optim, optim.step, partial(optim.zero_grad, set_to_none=True),
                       partial(gathered, False), partial(gathered, True))  # fmt: skip
    raise ValueError(f"unknown implementation {impl!r}")


def held_bytes(trained: Trained) -> dict[str, int]:
    """Bytes per category on this rank, counting each storage once, in the first category that reaches it: the
    implementation's own tensors first (the reference's shards and masters, which `checks.probes.memory` cannot
    see), then what the probe walks (FSDP's flat parameters, the model's parameters and gradients, optimizer
    state). A freed storage counts 0 bytes."""
    seen: set[int] = set()
    out = dict.fromkeys((*CATEGORIES, "unsharded", "buffers"), 0)
    for category, _label, value in (*trained.extra(), *held_tensors(trained.model, trained.optim)):
        for tensor in plain_tensors(value):
            storage = tensor.untyped_storage()
            if storage._cdata in seen:
                continue
            seen.add(storage._cdata)
            out[category] += storage.nbytes()
    return out
