"""Guide 16's drawn FSDP2 model, built: a root of bare parameters and an optional child ``c`` of its own, from the
plain data `checks.models.fsdp2_draws` draws in the pytest process, with the same values on every rank.

Nothing runs forward: the checks ``fully_shard`` it and all-gather its parameters with ``unshard``. Its values come
from a generator of its own seed, never the global RNG, so a check can build an unwrapped replica beside the
sharded model and slice its expected rows from it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # a drawn parameter's dtype, by its name


class Bare(nn.Module):
    """A module that only holds parameters (the checks all-gather them with ``unshard``; nothing runs forward)."""

    def __init__(self, params: list[dict[str, Any]], generator: torch.Generator) -> None:
        super().__init__()
        for p in params:
            value = torch.randn(p["shape"], generator=generator).to(DTYPES[p["dtype"]])
            self.register_parameter(p["name"], nn.Parameter(value))


def build(model: dict[str, Any], seed: int = 0) -> nn.Module:
    """The drawn model, the same values on every rank (its own generator, not the global RNG)."""
    generator = torch.Generator().manual_seed(seed)
    root = Bare(model["root"], generator)
    if model["child"] is not None:
        root.c = Bare(model["child"], generator)
    return root
