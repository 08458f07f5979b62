"""The drawn units of guide 12 as modules: what a unit description (`checks.models.flat_param_draws`) builds, the
batch it trains on, and FSDP1 wrapping it whole (one handle, one ``FlatParameter``).

Every rank builds the same values from its own generator, never the global RNG. The values are chosen so that
nothing rounds anywhere: parameters are multiples of 1/4 in [-1/2, 1/2], inputs are -1, 0 or 1, LayerNorm sees
rows of ±1 with ``eps=0`` (mean 0, variance 1, so it normalises exactly), and the loss ``sum(out + out²/2)`` has
the gradient ``1 + out``. Gradients are then small multiples of 1/16 that bf16's 8 significant bits hold exactly,
so sums across ranks in any order, the divisions by 2 of the pre- and post-divide, the casts and ``p - lr * g``
with ``lr = 1/4`` are all exact, and guide 12 compares with ``torch.equal``, bf16 ``param_dtype`` included.
"""

from __future__ import annotations

from functools import reduce
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy

from checks.models.flat_param_draws import MAX_DIM
from checks.ranks.context import RankContext

BATCH = 2
LOOKUPS = 2  # embedding indices per row

# The unit guide 12 draws (its `expect layout-at-4` block) and edits under summon_full_params: the spec tests'
# mixed unit, in the draws' naming.
LAYOUT_UNIT: dict[str, Any] = {
    "use_orig_params": True,
    "param_dtype": "float32",
    "root": [{"name": "w0", "shape": [2, 5], "frozen": False}, {"name": "w1", "shape": [0], "frozen": False}],
    "modules": [
        {"kind": "linear", "in": 5, "out": 3, "bias": True, "frozen": False},
        {"kind": "embedding", "num": 7, "dim": 3, "frozen": False},
        {"kind": "tied", "to": "m1.weight"},
    ],
}


class Holder(nn.Module):
    """A child with one parameter ``weight``: a bare parameter, or (tied) an earlier module's weight again."""

    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__()
        self.weight = weight


class DrawnUnit(nn.Module):
    """The module a unit description (`checks.models.flat_param_draws`) describes: the root's bare parameters
    ``w0, w1, …`` and children ``m0, m1, …``. Its forward uses every parameter, a tied one twice."""

    def __init__(self, unit: dict[str, Any], generator: torch.Generator) -> None:
        super().__init__()
        self.kinds = [m["kind"] for m in unit["modules"]]

        def value(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.randint(-2, 3, shape, generator=generator, dtype=torch.float32) / 4)

        self.root_names = [p["name"] for p in unit["root"]]
        for p in unit["root"]:
            self.register_parameter(p["name"], value(*p["shape"]))
        for i, m in enumerate(unit["modules"]):
            kind = m["kind"]
            if kind == "linear":
                child: nn.Module = nn.Linear(m["in"], m["out"], bias=m["bias"])
            elif kind == "embedding":
                child = nn.Embedding(m["num"], m["dim"])
            elif kind == "layernorm":
                child = nn.LayerNorm(m["dim"], eps=0.0)
            elif kind == "bare":
                child = Holder(value(*m["shape"]))
            else:
                child = Holder(reduce(getattr, m["to"].split("."), self))
            if kind in ("linear", "embedding", "layernorm"):
                for name, param in list(child.named_parameters(recurse=False)):
                    setattr(child, name, value(*param.shape))
            self.add_module(f"m{i}", child)
        for p in unit["root"]:
            getattr(self, p["name"]).requires_grad_(not p["frozen"])
        for i, m in enumerate(unit["modules"]):
            if m.get("frozen"):
                getattr(self, f"m{i}").requires_grad_(False)

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        outs = [getattr(self, name).reshape(-1) for name in self.root_names]
        for i, kind in enumerate(self.kinds):
            child = getattr(self, f"m{i}")
            if kind == "linear":
                outs.append(child(x[:, : child.in_features]).reshape(-1))
            elif kind == "embedding":
                outs.append(child(idx % child.num_embeddings).reshape(-1))
            elif kind == "layernorm":
                rows = torch.ones(x.shape[0], child.normalized_shape[0], dtype=x.dtype, device=x.device)
                rows[:, 1::2] = -1  # mean 0, variance 1: normalised exactly with eps=0
                outs.append(child(rows).reshape(-1))
            elif kind == "bare":
                outs.append(child.weight.reshape(-1))
            else:  # a tied weight's second use
                outs.append(0.5 * child.weight.reshape(-1))
        out = torch.cat(outs)
        return (out + 0.5 * out * out).sum()


def build_unit(unit: dict[str, Any], device: torch.device, seed: int = 0) -> DrawnUnit:
    """The drawn unit as a module, with the same values on every rank (its own generator, not the global RNG)."""
    return DrawnUnit(unit, torch.Generator().manual_seed(seed)).to(device)


def unit_batch(device: torch.device, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch, the same on every rank: inputs in {-1, 0, 1} and embedding indices."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(-1, 2, (BATCH, MAX_DIM), generator=generator).float()
    idx = torch.randint(0, 64, (BATCH, LOOKUPS), generator=generator)
    return x.to(device), idx.to(device)


def wrap_unit(ctx: RankContext, unit: dict[str, Any], **options: Any) -> FSDP:
    """The unit wrapped whole by FSDP1 (one handle, one flat parameter), FULL_SHARD on all ranks."""
    mixed = MixedPrecision(param_dtype=torch.bfloat16) if unit["param_dtype"] == "bfloat16" else None
    return FSDP(
        build_unit(unit, ctx.device),
        device_id=ctx.device,
        use_orig_params=unit["use_orig_params"],
        mixed_precision=mixed,
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        **options,
    )
